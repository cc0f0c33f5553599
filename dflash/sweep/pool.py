"""A pool of device slots that runs sweep jobs concurrently, one slot per job.

Invariants:
- A slot (a fixed group of GPU ids, or one CPU worker) runs at most one job at a time.
- No slot idles while jobs wait: one worker thread per slot, and a worker returns its
  slot before it takes the next job.
- Jobs start in the order given (first come, first served); results come back in
  that order too.

Nothing here knows about Hydra: `hydra_plugins/dflash_launcher` turns Hydra jobs into
calls of `run_in_slots`.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

from dflash.errors import ConfigError, require

JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class Slot:
    """One place a job can run: `devices` are GPU ids (empty for a CPU worker)."""

    index: int
    devices: tuple[str, ...]

    @property
    def cuda_visible_devices(self) -> str:
        """The CUDA_VISIBLE_DEVICES value of a job in this slot ("" hides every GPU)."""
        return ",".join(self.devices)

    def describe(self) -> str:
        return f"GPU {self.cuda_visible_devices}" if self.devices else f"CPU worker {self.index}"


def detect_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's list.

    Returns [] on machines without NVIDIA GPUs. Does not import torch (a sweep
    launcher must not initialise CUDA in the parent process).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [part.strip() for part in visible.split(",") if part.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    listing = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    if listing.returncode != 0:
        return []
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


def parse_gpu_ids(gpus, key: str = "gpus") -> list[str]:
    """GPU ids from a config value.

    gpus: "auto" (`detect_gpus()`), an int N (ids 0..N-1; 0 means no GPU), a string
    "0,2,5", a list of ids, or None (no GPU).
    """
    if gpus is None:
        return []
    if isinstance(gpus, bool):
        raise ConfigError(key, f"expected auto, a GPU count or a list of GPU ids, got {gpus!r}")
    if isinstance(gpus, int):
        require(gpus >= 0, key, f"a GPU count must be >= 0, got {gpus}")
        return [str(i) for i in range(gpus)]
    if isinstance(gpus, str):
        if gpus == "auto":
            return detect_gpus()
        return [part.strip() for part in gpus.split(",") if part.strip()]
    ids = [str(gpu) for gpu in gpus]
    require(len(set(ids)) == len(ids), key, f"GPU ids must be distinct, got {ids}")
    return ids


def device_slots(gpu_ids: Sequence[str], gpus_per_job: int = 1, cpu_jobs: int = 1) -> list[Slot]:
    """Split `gpu_ids` into slots of `gpus_per_job` GPUs; without GPUs, `cpu_jobs` CPU slots.

    GPUs left over when the count is not a multiple of `gpus_per_job` stay unused.
    """
    require(gpus_per_job >= 1, "gpus_per_job", f"must be >= 1, got {gpus_per_job}")
    require(cpu_jobs >= 1, "cpu_jobs", f"must be >= 1, got {cpu_jobs}")
    if not gpu_ids:
        return [Slot(i, ()) for i in range(cpu_jobs)]
    require(
        len(gpu_ids) >= gpus_per_job,
        "gpus_per_job",
        f"each job needs {gpus_per_job} GPUs but only {len(gpu_ids)} are available ({list(gpu_ids)})",
    )
    count = len(gpu_ids) // gpus_per_job
    return [Slot(i, tuple(gpu_ids[i * gpus_per_job : (i + 1) * gpus_per_job])) for i in range(count)]


def run_in_slots(
    jobs: Sequence[JobT],
    slots: Sequence[Slot],
    run_one: Callable[[JobT, Slot], ResultT],
    on_interrupt: Callable[[], None] | None = None,
) -> list[ResultT]:
    """Run `run_one(job, slot)` for every job, concurrently, each job in a free slot.

    run_one runs in a worker thread (it typically waits on a subprocess). An exception
    it raises is re-raised here once every job has finished. On Ctrl-C (or any
    exception in the waiting thread) jobs not yet started are dropped and
    `on_interrupt()` is called to stop the running ones.
    Returns the results in the order of `jobs`.
    """
    if not slots:  # device_slots gives at least one
        raise ValueError("no device slot to run jobs in")
    free: queue.SimpleQueue[Slot] = queue.SimpleQueue()
    for slot in slots:
        free.put(slot)

    def run_in_a_free_slot(job: JobT) -> ResultT:
        slot = free.get()
        try:
            return run_one(job, slot)
        finally:
            free.put(slot)

    executor = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="sweep-slot")
    futures = [executor.submit(run_in_a_free_slot, job) for job in jobs]
    try:
        wait(futures)
    except BaseException:
        for future in futures:
            future.cancel()
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        executor.shutdown(wait=True)
    return [future.result() for future in futures]
