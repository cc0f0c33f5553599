"""One sweep job = one subprocess running the Hydra app on a single grid point.

Why a subprocess per job (and not the app's function in the launcher's process):
- CUDA_VISIBLE_DEVICES must be set before CUDA initialises, so GPU placement needs a
  fresh process per job;
- a crash (segfault, out-of-memory kill, `sys.exit` of a config error) ends that job
  only, and the sweep goes on;
- the job runs in Hydra's RUN mode with the sweep's overrides for that point, so
  Lightning's DDP launcher, which re-runs the command line once per rank, starts more
  ranks of this job and never the whole sweep again.

Job directory layout (`output_dir`, the job's `hydra.sweep.dir/hydra.sweep.subdir`; names
in `dflash.layout`): the app's own outputs, `job.log` (stdout and stderr, one section per
attempt) and, after a failure, `error.json` (`error_record`), which a retry removes when it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from dflash.fileio import write_json
from dflash.layout import ERROR_FILE, LOG_FILE, RESULTS_FILE
from dflash.sweep.pool import Slot

# Read only the end of a job's log for its traceback: logs of long trainings are large.
LOG_TAIL_BYTES = 64 * 1024
TRACEBACK_START = "Traceback (most recent call last):"
HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"


@dataclass
class SweepJob:
    """A grid point: its Hydra job number, task overrides and absolute output directory."""

    index: int
    overrides: list[str]
    output_dir: str
    command: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"#{self.index} {' '.join(self.overrides)}"


@dataclass
class JobOutcome:
    """How a job ended: status is "completed", "failed" or "skipped" (already finished)."""

    job: SweepJob
    status: str
    slot: Slot | None = None
    returncode: int | None = None
    error: dict | None = None
    duration_s: float = 0.0


def is_finished(output_dir: str, result_file: str = RESULTS_FILE) -> bool:
    """A grid point is finished when its result file exists (apps write it atomically, last)."""
    return os.path.isfile(os.path.join(output_dir, result_file))


def app_command() -> list[str]:
    """The argv prefix that starts this process's program again: `python -m pkg.mod` or `python script.py`."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name:
        return [sys.executable, "-m", spec.name.removesuffix(".__main__")]
    return [sys.executable, os.path.abspath(sys.argv[0])]


def quoted_override_value(value: str) -> str:
    """`value` quoted for Hydra's override grammar (paths may hold '=' and ',')."""
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    raise ValueError(f"cannot quote a value holding both quote characters: {value!r}")


def job_command(app: list[str], overrides: list[str], hydra_overrides: list[str], output_dir: str) -> list[str]:
    """argv of one job: the app in RUN mode with the point's overrides, writing into `output_dir`."""
    return [*app, *overrides, *hydra_overrides, f"hydra.run.dir={quoted_override_value(output_dir)}"]


def job_environment(slot: Slot, base: dict | None = None) -> dict:
    """Environment of a job in `slot`: only its GPUs visible, full Hydra tracebacks.

    MASTER_PORT is dropped so that each job's DDP picks its own free port: jobs running
    side by side on one node must not share a rendezvous port.
    """
    env = dict(os.environ if base is None else base)
    env["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible_devices
    env["HYDRA_FULL_ERROR"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("MASTER_PORT", None)
    return env


class JobRunner:
    """Runs `SweepJob`s as subprocesses (callable as `run_one` of `run_in_slots`).

    Each job's output goes to `<output_dir>/job.log`; a non-zero exit writes
    `<output_dir>/error.json`. `terminate_all()` stops the jobs still running.
    """

    def __init__(self, log_file: str = LOG_FILE, env: dict | None = None, on_event=None):
        self.log_file = log_file
        self.env = env
        self.on_event = on_event or (lambda message: None)
        self._running: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def __call__(self, job: SweepJob, slot: Slot) -> JobOutcome:
        os.makedirs(job.output_dir, exist_ok=True)
        error_path = os.path.join(job.output_dir, ERROR_FILE)
        if os.path.exists(error_path):
            os.remove(error_path)
        log_path = os.path.join(job.output_dir, self.log_file)
        started = time.monotonic()
        with open(log_path, "a") as log:
            log.write(f"\n===== {_now()} job {job.describe()} on {slot.describe()}\n$ {' '.join(job.command)}\n")
            log.flush()
            with self._lock:
                if self._stopping:
                    return JobOutcome(job, "failed", slot, None, {"exception": "sweep interrupted before the job started"})
                process = subprocess.Popen(
                    job.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=job_environment(slot, self.env),
                    stdin=subprocess.DEVNULL,
                )
                self._running[job.index] = process
            self.on_event(f"started {job.describe()} on {slot.describe()}")
            returncode = process.wait()
            with self._lock:
                self._running.pop(job.index, None)
        duration = time.monotonic() - started
        if returncode == 0:
            self.on_event(f"finished {job.describe()} in {duration:.0f}s")
            return JobOutcome(job, "completed", slot, 0, None, duration)
        record = error_record(job, slot, returncode, _read_tail(log_path), log_path, duration)
        write_json(error_path, record, indent=2)
        self.on_event(f"FAILED {job.describe()}: {record['exception']} (see {error_path})")
        return JobOutcome(job, "failed", slot, returncode, record, duration)

    def terminate_all(self, grace_s: float = 10.0) -> None:
        """Stop running jobs: SIGTERM, then SIGKILL after `grace_s` seconds."""
        with self._lock:
            self._stopping = True
            processes = list(self._running.values())
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + grace_s
        for process in processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


def error_record(job: SweepJob, slot: Slot | None, returncode: int, log_tail: str, log_path: str, duration_s: float) -> dict:
    """The error.json content: what failed, how, and where to read more.

    exception: the last line of the job's last traceback (or its one-line config error,
    or the signal that killed it); traceback: that traceback's text, or None.
    """
    exception, trace = last_exception(log_tail)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (SIGKILL: often the out-of-memory killer)" if name == "SIGKILL" else ""
        exception = exception or f"killed by {name}{hint}"
    return {
        "status": "failed",
        "exception": exception or f"exited with status {returncode}",
        "traceback": trace,
        "returncode": returncode,
        "overrides": list(job.overrides),
        "devices": slot.cuda_visible_devices if slot is not None else None,
        "command": list(job.command),
        "log": log_path,
        "duration_s": round(duration_s, 3),
        "timestamp": _now(),
    }


def last_exception(log_text: str) -> tuple[str | None, str | None]:
    """(exception line, traceback text) of the last Python traceback in `log_text`.

    Without a traceback, the last `error: ...` line (the apps' one-line config errors)
    is the exception; (None, None) when there is neither.
    """
    lines = [line for line in log_text.splitlines() if not line.startswith(HYDRA_HINT)]
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK_START)]
    if starts:
        block = lines[starts[-1] :]
        # The traceback ends at its exception line: the first non-indented line after the frames.
        end = next((i for i in range(1, len(block)) if block[i] and not block[i].startswith((" ", "\t"))), None)
        if end is not None:
            block = block[: end + 1]
        return block[-1].strip(), "\n".join(block)
    errors = [line.strip() for line in lines if line.startswith("error: ")]
    return (errors[-1], None) if errors else (None, None)


def _read_tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
