"""A prompt's prefill (P tokens, float32, fast engine) with the kernel each projection tuned
for 64 rows (what prefill runs today) against each candidate kernel forced for rows > 64.
Best of 2 x 3 runs per cell, the kernels alternating.

    python docs/results/chat-kinds-2026-11-27f-amd/prefill_ab.py artifacts/targets/smollm2_135m
"""

import sys
import time

import torch

from dflash.bench import target_spec
from dflash.decoding.loop import prefill_forward
from dflash.specs import load_target
from dflash.target import kernels

torch.set_num_threads(2)
target = load_target(target_spec(sys.argv[1], "float32", "fast"))
linears = target.fast.linears()
target.new_cache()  # tunes the kernels
tuned = {id(linear): dict(linear.choice) for linear in linears}
print("path:", target.fast.kernel_path())


def force(kind):
    for linear in linears:
        linear.choice = dict(tuned[id(linear)])
        if kind:
            linear.choice[kernels.MAX_TUNED_ROWS] = kind


def best_prefill(length, repeats=3):
    ids = torch.randint(100, 40000, (1, length))
    best = float("inf")
    for _ in range(repeats):
        cache = target.new_cache()
        start = time.perf_counter()
        prefill_forward(target, ids, cache, [1, 14, 27])
        best = min(best, time.perf_counter() - start)
    return best


for length in (64, 128, 200, 320):
    seconds = {}
    for _ in range(2):
        for kind in (None, "mkl", "onednn", "dense"):
            force(kind)
            seconds[kind] = min(seconds.get(kind, float("inf")), best_prefill(length))
    flops = 2 * 134.5e6 * length
    cells = (f"{kind or 'tuned'} {s * 1e3:.0f} ms ({flops / s / 1e9:.0f} GF/s)" for kind, s in seconds.items())
    print(length, "  ".join(cells), flush=True)
