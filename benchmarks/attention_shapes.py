"""Our attention kernel built for each instruction set named on the command line, against SDPA,
at SmolLM2-135M's heads (9 query, 3 kv, head_dim 64), 2 threads, float32 and bfloat16, over
30 layers' caches (each layer's keys and values its own views of a larger static cache, so
they are read cold, as in a forward):

- regeneration's step: 128 rows, one query each, 88 keys of a 192-position cache, left padding;
- decoding and verification: one row, 1, 3 and 8 queries over 300 keys;
- a prefill: 8 rows of 56 new positions, causal with left padding, and one row of 512.

Each cell keeps the median of 15 passes over the 30 layers, per layer call; the read of the
keys and values at the bench's bandwidth probe (a 256 MiB sum) is printed beside the
regeneration cell. Nothing else should run on the cores.

    python benchmarks/attention_shapes.py avx512_bf16 avx2
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from dflash.engine import native

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64
CASES = [  # (name, batch, queries, keys, cache capacity, left padding up to)
    ("regeneration step", 128, 1, 88, 192, 16),
    ("decode", 1, 1, 300, 512, 0),
    ("verify 3", 1, 3, 300, 512, 0),
    ("verify 8", 1, 8, 300, 512, 0),
    ("prefill 8 x 56", 8, 56, 56, 120, 14),
    ("prefill 512", 1, 512, 512, 576, 0),
]


def per_call(run, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / LAYERS


def layers_of(kernel, query, views, mask):
    """One pass of `kernel` over every layer's cache views."""
    return lambda: [kernel(query, k, v, mask, HEAD_DIM**-0.5) for k, v in views]


def main(isas: list[str]) -> None:
    torch.set_num_threads(2)
    modules = {isa: native.build(isa) for isa in isas}
    probe = torch.ones(64 * 1024**2)
    for dtype in (torch.float32, torch.bfloat16):
        generator = torch.Generator().manual_seed(0)
        for name, batch, q, length, capacity, padding in CASES:
            shape = (LAYERS, batch, KV_HEADS, capacity, HEAD_DIM)
            keys, values = (torch.randn(shape, generator=generator).to(dtype) for _ in range(2))
            query = torch.randn(batch, q, HEADS, HEAD_DIM, generator=generator).to(dtype).transpose(1, 2)
            positions = torch.arange(length)
            pads = torch.randint(0, padding + 1, (batch,), generator=generator)
            seen = (positions >= pads[:, None])[:, None, None, :] & (positions <= torch.arange(length - q, length)[:, None])
            mask = seen | (positions == torch.arange(length - q, length)[:, None])  # a padded query sees itself
            views = [(keys[i, ..., :length, :], values[i, ..., :length, :]) for i in range(LAYERS)]
            kernels = {isa: module.decode_attention for isa, module in modules.items()}
            kernels["sdpa"] = lambda q_, k_, v_, m_, s_: F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m_, enable_gqa=True)
            with torch.inference_mode():
                cells = {name_: per_call(layers_of(kernel, query, views, mask)) for name_, kernel in kernels.items()}
            line = f"{str(dtype).removeprefix('torch.')} {name}: " + ", ".join(f"{k} {1e6 * s:.0f} us" for k, s in cells.items())
            if batch > 1 and q == 1:
                read = 2 * batch * KV_HEADS * length * HEAD_DIM * keys.element_size()
                bandwidth = probe.numel() * 4 / (per_call(probe.sum, 5) * LAYERS)
                line += f" (its keys and values read at {bandwidth / 1e9:.0f} GB/s: {1e6 * read / bandwidth:.0f} us)"
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(native.cpu_isas()[:1]))
