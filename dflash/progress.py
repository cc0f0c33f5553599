"""Progress in logs that are not a terminal, without Lightning: whether output is a terminal
(`is_interactive`), how often a tqdm bar redraws (`bar_interval`), durations as `H:MM:SS`, and the time
budget's clock of a fit (`budget_timer`, which imports Lightning only when called).

Apps that never train (evaluate, export, tables, regenerate) import this module: it must not import
Lightning at the top, which costs seconds per process. The `LineProgress` callback is `dflash.fit_progress`.
"""

from __future__ import annotations

import os
import sys

PROGRESS_INTERVAL_S = 30.0


def is_interactive(stream=None) -> bool:
    """True when `stream` (default: stdout, where progress bars draw) is a terminal."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def bar_interval(terminal_s: float = 0.1) -> float:
    """Seconds a tqdm bar waits between redraws: `terminal_s` on a terminal, `PROGRESS_INTERVAL_S`
    in a log or a pipe; `TQDM_MININTERVAL` wins when it is set (tqdm itself reads it once, at import).
    """
    value = os.environ.get("TQDM_MININTERVAL", "").strip()
    if value:
        try:
            return float(value)
        except ValueError:
            pass  # tqdm ignores a malformed value too
    return terminal_s if is_interactive() else PROGRESS_INTERVAL_S


def format_duration(seconds: float) -> str:
    """`H:MM:SS` for a number of seconds (negative counts as 0)."""
    whole = int(max(0.0, seconds) + 0.5)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def budget_timer(trainer):
    """Lightning's Timer of the time budget (`trainer.max_minutes`), or None without one
    (a Timer with no duration is not a budget)."""
    from lightning.pytorch.callbacks import Timer

    for callback in getattr(trainer, "callbacks", ()):
        if isinstance(callback, Timer) and callback.time_remaining("train") is not None:
            return callback
    return None
