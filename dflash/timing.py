"""Wall-clock timing of a step, synchronised with the device it runs on: what
`python -m dflash.bench`, the demo and the scripts time with.

A CUDA step is timed from a synchronised start to a synchronised end, so queued kernels
count; several steps take turns within each repeat (`interleaved_ms`), so that a slow
spell of a shared machine falls on all of them alike; the median counts.
"""

from __future__ import annotations

import statistics
import time


def sync(device) -> None:
    """Wait for the work queued on `device` (a CUDA device; nothing to wait for elsewhere)."""
    if getattr(device, "type", device) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def timed(fn, device="cpu"):
    """(fn(), its seconds), synchronised with `device` at both ends."""
    sync(device)
    start = time.perf_counter()
    value = fn()
    sync(device)
    return value, time.perf_counter() - start


def interleaved_ms(steps: dict, repeats: int, device="cpu", warmup: int = 2) -> dict:
    """Median milliseconds of each step after `warmup` untimed calls of each; the steps take
    turns within each repeat."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(1000 * timed(step, device)[1])
    return {name: statistics.median(values) for name, values in times.items()}


def median_seconds(fn, repeats: int, device="cpu", warmup: int = 1) -> float:
    """Median seconds of `repeats` calls of `fn` after `warmup` untimed ones."""
    return interleaved_ms({"step": fn}, repeats, device, warmup)["step"] / 1000
