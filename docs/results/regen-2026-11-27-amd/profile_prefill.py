"""Batched greedy generation of SmolLM2-135M at 128 rows (the bench's prompts): its rate, then
torch.profiler's table of a 24-token run. Our kernels are not torch ops and do not show; what
shows is PyTorch's share (the prefill's masked SDPA, copies, fills).

    python docs/results/regen-2026-11-27-amd/profile_prefill.py bfloat16
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dflash.bench import target_spec
from dflash.specs import load_target
from dflash.target.batched import greedy_batch


def main(dtype: str = "bfloat16", batch: int = 128, new: int = 64) -> None:
    torch.set_num_threads(2)
    target = load_target(target_spec("smollm2_135m", dtype, "auto"))
    target.new_cache()  # tunes the kernels
    rows = [[100 + (7 * row + i) % 5000 for i in range(48 + row % 16)] for row in range(batch)]
    never = {-1}
    greedy_batch(target.fast, rows[:4], 4, never, 0)
    start = time.perf_counter()
    greedy_batch(target.fast, rows, new, never, 0)
    seconds = time.perf_counter() - start
    print(f"{dtype}: {batch * new / seconds:.0f} tok/s ({seconds:.2f} s)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        greedy_batch(target.fast, rows, 24, never, 0)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main(*sys.argv[1:2])
