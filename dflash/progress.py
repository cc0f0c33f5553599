"""Training progress for logs that are not a terminal.

A progress bar redraws one line in place: in a log file or a pipe (`make demo > log
2>&1`, a batch job) it shows nothing readable for minutes. There, `LineProgress`
writes one plain line at most every `interval_s` seconds instead:

    train: step 120/1600 (8%), loss 3.412, 2.71 steps/s, elapsed 0:00:44, ETA 0:09:06

Invariants:
- On a terminal Lightning's own bar shows progress and no lines are written; elsewhere
  no bar is drawn (`training_progress` decides both from one `isatty()`).
- Lines come from global rank 0 only, through the `dflash.progress` logger
  (so a Hydra app's console and its log file both get them).
- `loss` is the mean training loss of the optimizer steps since the previous line;
  rate and ETA count only the steps run by this process (a resumed run does not claim
  the steps of its predecessor).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 30.0


def is_interactive(stream=None) -> bool:
    """True when `stream` (default: stdout, where progress bars draw) is a terminal."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def bar_interval(terminal_s: float = 0.1) -> float:
    """Seconds a tqdm bar waits between redraws: `terminal_s` on a terminal, `PROGRESS_INTERVAL_S`
    in a log or a pipe; `TQDM_MININTERVAL` wins when it is set.

    Our own bars pass this as `mininterval=`: tqdm reads `TQDM_MININTERVAL` only once, when
    tqdm is first imported, which in an app that imports our packages is before its `main`
    could set the variable (a log got a redraw per batch).
    """
    value = os.environ.get("TQDM_MININTERVAL", "").strip()
    if value:
        try:
            return float(value)
        except ValueError:
            pass  # tqdm ignores a malformed value too
    return terminal_s if is_interactive() else PROGRESS_INTERVAL_S


def training_progress(enabled: bool, label: str = "train", interval_s: float = PROGRESS_INTERVAL_S) -> tuple[bool, list[Callback]]:
    """How to show training progress: (draw Lightning's progress bar?, extra callbacks).

    enabled: the `trainer.enable_progress_bar` setting; False shows neither a bar nor lines.
    On a terminal: the bar. Otherwise: a `LineProgress` callback.
    """
    if not enabled:
        return False, []
    if is_interactive():
        return True, []
    return False, [LineProgress(label, interval_s)]


def format_duration(seconds: float) -> str:
    """`H:MM:SS` for a number of seconds (negative counts as 0)."""
    whole = int(max(0.0, seconds) + 0.5)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class LineProgress(Callback):
    """Log `<label>: step N/M (P%), loss L, R steps/s, elapsed E, ETA T` at most every
    `interval_s` seconds of training, after validation (its metrics), and at the last step.

    clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, label: str = "train", interval_s: float = PROGRESS_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.interval_s = interval_s
        self.clock = clock
        self._started = self._last_line = 0.0
        self._start_step = 0
        self._loss_sum = 0.0
        self._loss_count = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._started = self._last_line = self.clock()
        self._start_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss_sum += float(loss)
            self._loss_count += 1
        now = self.clock()
        total = _total_steps(trainer)
        last_step = total is not None and trainer.global_step >= total
        if now - self._last_line >= self.interval_s or last_step:
            self._write(trainer, now)

    def on_train_end(self, trainer, pl_module) -> None:
        # A time budget ends training at a step no one knew in advance: its line comes here.
        if self._loss_count:
            self._write(trainer, self.clock())

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return  # the sanity check, or trainer.validate() outside training
        metrics = trainer.callback_metrics
        values = [
            f"{name} {float(metrics[key]):.3f}"
            for name, key in (("loss", "val/loss"), ("tau_sim", "val/tau_sim"))
            if key in metrics
        ]
        if values and trainer.is_global_zero:
            log.info("%s: validation at step %d: %s", self.label, trainer.global_step, ", ".join(values))

    def _write(self, trainer, now: float) -> None:
        self._last_line = now
        step, total = trainer.global_step, _total_steps(trainer)
        elapsed = now - self._started
        done = step - self._start_step
        parts = [f"step {step}/{total} ({100 * step / max(1, total):.0f}%)" if total is not None else f"step {step}"]
        if self._loss_count:
            parts.append(f"loss {self._loss_sum / self._loss_count:.3f}")
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            parts += [f"{rate:.2f} steps/s", f"elapsed {format_duration(elapsed)}"]
            eta = (total - step) / rate if total is not None else None
            remaining = _time_remaining(trainer)
            if remaining is not None:  # a time budget: it ends training unless the steps run out first
                eta = remaining if eta is None else min(eta, remaining)
            parts.append(f"ETA {format_duration(eta)}")
        self._loss_sum, self._loss_count = 0.0, 0
        if trainer.is_global_zero:
            log.info("%s: %s", self.label, ", ".join(parts))


def _total_steps(trainer) -> int | None:
    """The optimizer steps this fit will run in all (max_steps, else Lightning's estimate);
    None when only a time budget bounds it."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps
    estimate = trainer.estimated_stepping_batches
    return int(estimate) if math.isfinite(estimate) else None


def budget_timer(trainer):
    """Lightning's Timer of the time budget (`trainer.max_minutes`), or None without one
    (a Timer with no duration is not a budget)."""
    from lightning.pytorch.callbacks import Timer

    for callback in getattr(trainer, "callbacks", ()):
        if isinstance(callback, Timer) and callback.time_remaining("train") is not None:
            return callback
    return None


def _time_remaining(trainer) -> float | None:
    """Seconds left of the time budget, if there is one."""
    timer = budget_timer(trainer)
    return None if timer is None else timer.time_remaining("train")
