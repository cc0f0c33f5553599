"""Batched greedy generation of SmolLM2-135M at 128 rows (the bench's prompts): its rate, then
torch.profiler's table of a 24-token run. Our kernels are not torch ops and do not show; what
shows is PyTorch's share (the prefill's masked SDPA, copies, fills).

    python docs/results/regen-2026-11-27-amd/profile_prefill.py bfloat16
"""

import sys, time, torch
from dflash.bench import target_spec
from dflash.specs import load_target
from dflash.target.batched import greedy_batch

torch.set_num_threads(2)
dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
target = load_target(target_spec("smollm2_135m", dtype, "auto"))
target.new_cache()
fast = target.fast
batch, new = 128, 64
rows = [[100 + (7 * row + i) % 5000 for i in range(48 + row % 16)] for row in range(batch)]
never = {-1}
greedy_batch(fast, rows[:4], 4, never, 0)
t = time.perf_counter()
greedy_batch(fast, rows, new, never, 0)
s = time.perf_counter() - t
print(f"{dtype}: {batch * new / s:.0f} tok/s ({s:.2f} s)")
from torch.profiler import profile, ProfilerActivity

with profile(activities=[ProfilerActivity.CPU]) as prof:
    greedy_batch(fast, rows, 24, never, 0)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
