"""Our small-row GEMM built for each instruction set named on the command line, timed over one
forward's worth of SmolLM2-135M's weight shapes (30 layers' qkv, o, gate_up, down and the head;
random weights, 2 threads) at 1, 3, 8 and 16 rows, in float32 and bfloat16; the sets take turns
and each keeps its fastest of 7 passes. Nothing else should run on the cores.

    python benchmarks/gemm_per_isa.py avx512_bf16 avx512 avx2
"""

from __future__ import annotations

import sys
import time

import torch

from dflash.engine import kernels, native

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def main(isas: list[str]) -> None:
    torch.set_num_threads(2)
    modules = {isa: native.build(isa) for isa in isas}
    for dtype in (torch.float32, torch.bfloat16):
        generator = torch.Generator().manual_seed(0)
        weights = [torch.randn(n, k, generator=generator).to(dtype) for n, k in SHAPES]
        size = sum(w.numel() * w.element_size() for w in weights)
        packed = {isa: [kernels.pack(w, kernels.tile_columns(m, w)) for w in weights] for isa, m in modules.items()}
        for rows in (1, 3, 8, 16):
            inputs = {k: torch.randn(rows, k).to(dtype) for k in (576, 1536)}
            best: dict[str, float] = {}
            for _ in range(7):
                for isa, module in modules.items():
                    start = time.perf_counter()
                    with torch.inference_mode():
                        for (n, k), weight in zip(SHAPES, packed[isa]):
                            module.small_linear(inputs[k], weight, None, n)
                    best[isa] = min(best.get(isa, float("inf")), time.perf_counter() - start)
            cells = " ".join(f"{isa} {1000 * s:.1f} ms ({size / s / 1e9:.0f} GB/s)" for isa, s in best.items())
            print(f"{str(dtype).removeprefix('torch.')} rows {rows}: {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(native.cpu_isas()))
