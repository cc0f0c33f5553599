"""Where the fast engine's target forward spends its time: the weight matmuls (every `Linear`
call, timed around the call) against everything else (attention over the cache, the layer ops,
Python), at each verify width, after a 300-token context. Run it once per instruction set to
compare them (`DFLASH_KERNEL_ISA=avx2` on an AVX-512 CPU); nothing else should run on the cores.

    DFLASH_KERNEL_ISA=avx2 python benchmarks/forward_split.py float32 1,3,8
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from dflash.bench import target_spec
from dflash.engine import kernels
from dflash.specs import load_target
from dflash.target import crop_cache

CONTEXT, REPEATS, TAPS = 300, 25, [1, 10, 19, 28]


def main(dtype: str, widths: list[int]) -> None:
    torch.set_num_threads(2)
    target = load_target(target_spec("smollm2_135m", dtype, "fast"))
    ids = torch.randint(100, 20_000, (1, CONTEXT + max(widths)), generator=torch.Generator().manual_seed(0))
    cache, in_matmuls = target.new_cache(), [0.0]
    call = kernels.Linear.__call__

    def timed_call(linear, x):
        start = time.perf_counter()
        out = call(linear, x)
        in_matmuls[0] += time.perf_counter() - start
        return out

    with torch.inference_mode():
        target.forward(ids[:, :CONTEXT], torch.arange(CONTEXT).unsqueeze(0), cache, TAPS, logits_to_keep=1)
        for width in widths:
            positions = torch.arange(CONTEXT, CONTEXT + width).unsqueeze(0)

            def step(width=width, positions=positions):
                target.forward(ids[:, CONTEXT : CONTEXT + width], positions, cache, TAPS if width > 1 else None)
                crop_cache(cache, CONTEXT)

            for _ in range(5):
                step()
            plain, total, matmuls = [], [], []
            for _ in range(REPEATS):  # plain and instrumented forwards take turns
                start = time.perf_counter()
                step()
                plain.append(time.perf_counter() - start)
                kernels.Linear.__call__, in_matmuls[0] = timed_call, 0.0
                start = time.perf_counter()
                step()
                total.append(time.perf_counter() - start)
                matmuls.append(in_matmuls[0])
                kernels.Linear.__call__ = call
            ms = [1e3 * statistics.median(v) for v in (plain, total, matmuls)]
            print(f"B={width}: forward {ms[0]:.2f} ms; instrumented {ms[1]:.2f} = matmuls {ms[2]:.2f} + rest {ms[1] - ms[2]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], [int(w) for w in sys.argv[2].split(",")])
