"""What both demos share: stage headers, wall time per stage, subprocess stages,
stable names for a stage's output, and progress bars fit for a log file.

Invariant: a stage whose output exists and is current is skipped, so each demo can be
interrupted at any point and run again; names of outputs hash the settings that made them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

SUMMARY = "demo_summary.json"
NUM_STAGES = 5
PROGRESS_INTERVAL_S = 30  # how often progress bars may redraw in a log that is not a terminal


def stage(number: int, name: str, message: str) -> None:
    print(f"\n=== [{number}/{NUM_STAGES}] {name}: {message}", flush=True)


class StageClock:
    """Wall time of each stage, in the order they ran (a reused stage counts its check)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def time(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 1)

    def table(self) -> str:
        """One line per stage, `name  M min S s`, then the total."""
        rows = [*self.seconds.items(), ("total", sum(self.seconds.values()))]
        return "\n".join(f"  {name:<10}{_minutes(seconds):>14}" for name, seconds in rows)


def _minutes(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60:2d} s"


def short_hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def run_stage(number: int, name: str, command: list[str]) -> None:
    """Run a stage's app; exit with its status when it fails (it has printed its own error)."""
    status = subprocess.run(command).returncode
    if status != 0:
        print(f"error: stage {number} ({name}) failed with exit status {status}; see its output above", file=sys.stderr)
        sys.exit(status)


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check_stage_overrides(cfg, stages) -> None:
    """ConfigError unless each list of overrides composes with the app of its stage.

    stages: (config key, app config name, base overrides, example override) per list; the
        values are the app's own to check when the stage runs.
    """
    from omegaconf import ListConfig

    from dflash.cli.common import check_overrides
    from dflash.errors import ConfigError, require

    for key, app, base, example in stages:
        overrides = cfg[key]
        require(
            isinstance(overrides, ListConfig) and all(isinstance(o, str) for o in overrides),
            key,
            f"must be a list of quoted {app} overrides like '[\"{example}\"]', got {overrides!r}",
        )
        try:
            check_overrides(app, [*base, *overrides])
        except ConfigError as err:
            raise ConfigError(key, str(err)) from None


def quiet_progress_bars() -> None:
    """In a log that is not a terminal, progress bars cannot redraw: let them write at most
    every 30 s. tqdm reads the variable when it is imported: the apps each stage runs as a
    subprocess see it; in this process tqdm is already imported, and our own bars take the
    interval from `dflash.progress.bar_interval` instead."""
    if not sys.stdout.isatty():
        os.environ.setdefault("TQDM_MININTERVAL", str(PROGRESS_INTERVAL_S))
