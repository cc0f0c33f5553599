"""The GPU pool: one job per slot at a time, no slot idle while jobs wait; job records."""

from __future__ import annotations

import threading
import time

import pytest

from dflash.errors import ConfigError
from dflash.sweep.jobs import SweepJob, error_record, last_exception, quoted_override_value
from dflash.sweep.pool import Slot, device_slots, parse_gpu_ids, run_in_slots

# Tolerance for "immediately" in the scheduling checks: thread hand-over on a loaded
# 2-core machine takes well under this.
SLACK_S = 0.08


def _run_fake_sweep(durations: list[float], gpu_ids: list[str], gpus_per_job: int = 1):
    """Run sleeping jobs on fake GPUs; return (t0, [(job, devices, start, end)])."""
    slots = device_slots(gpu_ids, gpus_per_job)
    lock = threading.Lock()
    busy: set[str] = set()
    intervals = []

    def run_one(job: int, slot: Slot):
        start = time.monotonic()
        with lock:
            # The invariant itself, checked at the moment it could break.
            assert not busy & set(slot.devices), f"GPU {slot.devices} given to job {job} while busy"
            busy.update(slot.devices)
        time.sleep(durations[job])
        with lock:
            busy.difference_update(slot.devices)
        end = time.monotonic()
        intervals.append((job, slot.devices, start, end))
        return job

    t0 = time.monotonic()
    results = run_in_slots(list(range(len(durations))), slots, run_one)
    assert results == list(range(len(durations)))  # results come back in job order
    return t0, intervals


def test_never_two_jobs_on_one_gpu_and_no_gpu_idles_while_jobs_wait():
    durations = [0.30, 0.05, 0.20, 0.15, 0.05, 0.25, 0.10]
    t0, intervals = _run_fake_sweep(durations, ["0", "1", "2"])
    assert sorted(job for job, *_ in intervals) == list(range(7))
    last_start = max(start for _, _, start, _ in intervals)
    for gpu in ("0", "1", "2"):
        mine = sorted((start, end) for _, devices, start, end in intervals if devices == (gpu,))
        assert mine, f"GPU {gpu} never used"
        assert mine[0][0] - t0 < SLACK_S, "a GPU idled at the start while jobs waited"
        for (_, prev_end), (next_start, _) in zip(mine, mine[1:]):
            assert next_start >= prev_end, f"two jobs overlapped on GPU {gpu}"
            assert next_start - prev_end < SLACK_S, f"GPU {gpu} idled while jobs waited"
        # A GPU whose last job ended before the last job started idled while that job waited.
        assert mine[-1][1] > last_start - SLACK_S, f"GPU {gpu} idled while a job waited"
    # Jobs start in order (first come, first served).
    starts = [start for _, _, start, _ in sorted(intervals)]
    assert starts == sorted(starts)


def test_jobs_with_several_gpus_each_get_disjoint_groups():
    t0, intervals = _run_fake_sweep([0.1, 0.05, 0.1, 0.05, 0.1], ["0", "1", "2", "3", "5"], gpus_per_job=2)
    groups = {devices for _, devices, _, _ in intervals}
    assert groups == {("0", "1"), ("2", "3")}  # GPU 5 left over: 5 GPUs make two slots of 2


def test_a_job_that_raises_does_not_stop_the_others():
    done = []

    def run_one(job, slot):
        if job == 1:
            raise RuntimeError("bug in run_one")
        time.sleep(0.05)
        done.append(job)

    with pytest.raises(RuntimeError, match="bug in run_one"):
        run_in_slots([0, 1, 2, 3], device_slots([], cpu_jobs=2), run_one)
    assert sorted(done) == [0, 2, 3]


def test_gpu_ids_from_config_values(monkeypatch):
    assert parse_gpu_ids(3) == ["0", "1", "2"]
    assert parse_gpu_ids(0) == [] and parse_gpu_ids(None) == []
    assert parse_gpu_ids("0,2,5") == ["0", "2", "5"]
    assert parse_gpu_ids([1, 3]) == ["1", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert parse_gpu_ids("auto") == ["4", "6"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert parse_gpu_ids("auto") == []
    with pytest.raises(ConfigError, match="^gpus: "):  # the fields; the launcher adds hydra.launcher
        parse_gpu_ids([1, 1])
    with pytest.raises(ConfigError, match="^gpus_per_job: "):
        device_slots(["0", "1"], gpus_per_job=4)
    assert [s.describe() for s in device_slots([], cpu_jobs=2)] == ["CPU worker 0", "CPU worker 1"]
    assert device_slots([], cpu_jobs=1)[0].cuda_visible_devices == ""  # CPU jobs see no GPU


def test_error_record_names_the_exception_and_keeps_the_traceback():
    log = "\n".join(
        [
            "[2026-01-01][dflash][INFO] - training",
            "Traceback (most recent call last):",
            '  File "x.py", line 3, in <module>',
            "    main()",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
            "[rank1] other output",
        ]
    )
    job = SweepJob(3, ["drafter.num_layers=8"], "/tmp/x", ["python", "-m", "dflash.train"])
    record = error_record(job, Slot(0, ("2",)), 1, log, "/tmp/x/job.log", 12.5)
    assert record["exception"] == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert record["traceback"].startswith("Traceback") and record["traceback"].endswith("2.00 GiB")
    assert record["devices"] == "2" and record["overrides"] == ["drafter.num_layers=8"] and record["returncode"] == 1


def test_error_record_without_traceback():
    job = SweepJob(0, [], "/tmp/x", [])
    assert last_exception("...\nerror: drafter.num_layers: must be >= 1, got 0\n") == (
        "error: drafter.num_layers: must be >= 1, got 0",
        None,
    )
    killed = error_record(job, None, -9, "loading\n", "/tmp/x/job.log", 1.0)
    assert killed["exception"].startswith("killed by SIGKILL")
    assert error_record(job, None, 3, "", "/tmp/x/job.log", 1.0)["exception"] == "exited with status 3"


def test_paths_with_equals_and_commas_are_quoted_for_hydra():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = "/a/sweeps/block_size/drafter.block_size=8,seed=0"
    override = OverridesParser.create().parse_override(f"hydra.run.dir={quoted_override_value(path)}")
    assert override.value() == path and not override.is_sweep_override()
