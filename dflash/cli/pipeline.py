"""What both demos share: stage headers, wall time per stage, subprocess stages (the
train stage's and evaluate stage's "done" checks among them), stable names for a stage's
output, the summary file, and progress bars fit for a log file.

Invariant: a stage whose output exists and is current is skipped, so each demo can be
interrupted at any point and run again; names of outputs hash the settings that made them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

from dflash.fileio import json_digest, read_json, write_json
from dflash.layout import (
    CHECKPOINT_DIR,
    DEMO_SUMMARY,
    DRAFTER_CONFIG,
    DRAFTER_DIR,
    DRAFTER_WEIGHTS,
    EVAL_COMMAND,
    RESULTS_FILE,
)

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

    def totals(self) -> dict[str, float]:
        """Seconds per stage, then the total (demo_summary.json `stage_wall_time_s`)."""
        return {**self.seconds, "total": round(sum(self.seconds.values()), 1)}

    def table(self) -> str:
        """One line per stage, `name  M min S s`, then the total."""
        rows = [*self.seconds.items(), ("total", sum(self.seconds.values()))]
        return "\n".join(f"  {name:<10}{_minutes(seconds):>14}" for name, seconds in rows)


def _minutes(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60:2d} s"


def short_hash(*parts) -> str:
    return json_digest(parts, 10, default=str)


def recipe(name: str) -> str:
    """The text of dflash/conf/experiment/`name`.yaml: part of a run's name, so that editing
    the recipe trains anew."""
    from dflash import CONF_DIR

    with open(os.path.join(CONF_DIR, "experiment", f"{name}.yaml")) as f:
        return f.read()


def app_command(app: str, *arguments: str) -> list[str]:
    """`python -m dflash.<app> arguments...` in this interpreter."""
    return [sys.executable, "-m", f"dflash.{app}", *arguments]


def shown(command: list[str]) -> str:
    return " ".join(["python", *command[1:]])


def run_stage(number: int, name: str, command: list[str]) -> None:
    """Run a stage's app; exit with its status when it fails (it has printed its own error)."""
    status = subprocess.run(command).returncode
    if status != 0:
        print(f"error: stage {number} ({name}) failed with exit status {status}; see its output above", file=sys.stderr)
        sys.exit(status)


def train_stage(run_dir: str, command: Callable[[], list[str]]) -> str:
    """Stage 3: the train app (which resumes and exports the drafter), unless the run's
    drafter directory is complete; `command` is called only when it runs. Returns `run_dir`."""
    drafter = os.path.join(run_dir, DRAFTER_DIR)
    if all(os.path.isfile(os.path.join(drafter, name)) for name in (DRAFTER_CONFIG, DRAFTER_WEIGHTS)):
        stage(3, "train", f"done already in {run_dir}")
        return run_dir
    arguments = command()
    stage(3, "train", shown(arguments))
    run_stage(3, "train", arguments)
    return run_dir


def evaluate_stage(eval_dir: str, command: list[str], label: str = "") -> str:
    """Stage 4: the evaluate app `command` into `eval_dir`, unless its results.json exists
    and answers the same arguments (other settings evaluate again); returns results.json."""
    results_path, marker = os.path.join(eval_dir, RESULTS_FILE), os.path.join(eval_dir, EVAL_COMMAND)
    if os.path.isfile(results_path) and read_json(marker) == command[2:]:
        stage(4, "evaluate", f"{label}done already in {eval_dir}")
        return results_path
    stage(4, "evaluate", label + shown(command))
    run_stage(4, "evaluate", command)
    write_json(marker, command[2:])
    return results_path


def finish(run_dir: str, summary: dict, clock: StageClock, heading: str, evaluation: str, logs: str) -> None:
    """Write `summary` as the run's demo_summary.json; print the stage times under `heading`
    and what the run directory holds (`evaluation`: where results.json is, `logs`)."""
    write_json(os.path.join(run_dir, DEMO_SUMMARY), summary, indent=2)
    print(f"\n{heading}:")
    print(clock.table())
    files = f"{evaluation}/{RESULTS_FILE}, {DEMO_SUMMARY}, {CHECKPOINT_DIR}/, {logs}"
    print(f"\nrun directory: {run_dir}\n  {DRAFTER_DIR}/ (load with drafter.path=...), {files}")


def check_stage_overrides(app, stages) -> None:
    """ConfigError unless each list of overrides of the demo's config object `app` composes with
    the app of its stage. stages: (config key, app config name, base overrides) per list; the
    values are the stage app's own to check when the stage runs."""
    from dflash.cli.common import check_overrides
    from dflash.errors import ConfigError

    for key, stage_app, base in stages:
        try:
            check_overrides(stage_app, [*base, *getattr(app, key)])
        except ConfigError as err:
            raise ConfigError(key, str(err)) from None


def quiet_progress_bars() -> None:
    """In a log that is not a terminal, let progress bars write at most every 30 s. tqdm reads the variable
    when imported: the stages' subprocesses see it; in this process our own bars take the interval from
    `dflash.progress.bar_interval` instead (tqdm is already imported)."""
    if not sys.stdout.isatty():
        os.environ.setdefault("TQDM_MININTERVAL", str(PROGRESS_INTERVAL_S))
