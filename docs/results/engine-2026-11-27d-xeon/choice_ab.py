"""The kernel choices `make demo` runs I and J made (their `kernel_path`), timed against each
other in one process: the target's float32 forward over 1 and 3 new tokens after 300
positions, 2 threads, median of 15 alternating repeats.

    python docs/results/engine-2026-11-27d-xeon/choice_ab.py

Run from the repository root after `make demo` (artifacts/targets/smollm2_135m).
"""

import re
import statistics
import time

import torch

from dflash.specs import TargetSpec, load_target
from dflash.target import kernels

torch.set_num_threads(2)
paths = {
    "I": "qkv avx512(1-64), o dense(1-3) avx512(4-16) mkl(64), gate_up avx512(1-64), down dense(1-3) avx512(4-16) dense(64); head avx512(1-64)",
    "J": "qkv dense(1-3) avx512(4-64), o dense(1-3) avx512(4-64), gate_up avx512(1-64), down dense(1-3) avx512(4-5) dense(6) avx512(8-64); head avx512(1-64)",
}
rows_all = list(kernels.TUNED_ROWS) + [kernels.MAX_TUNED_ROWS]


def parse(desc):
    out = {}
    for part in re.split(r"[,;] ", desc):
        name, rest = part.split(" ", 1)
        ch = {}
        for kind, lo, hi in re.findall(r"(\w+)\((\d+)(?:-(\d+))?\)", rest):
            lo = int(lo)
            hi = int(hi or lo)
            for r in rows_all:
                if lo <= r <= hi:
                    ch[r] = kind
        out[name] = ch
    return out


target = load_target(TargetSpec(path="artifacts/targets/smollm2_135m", dtype="float32"))
fast = target.fast
fast.prepare()


def apply(name):
    c = parse(paths[name])
    for layer in fast.layers:
        for proj in ("qkv", "o", "gate_up", "down"):
            lin = getattr(layer, proj)
            lin.choice = dict(c[proj])
    fast.lm_head.choice = dict(c["head"])


ids = torch.randint(100, 20000, (1, 316))
cache = fast.new_cache(capacity=400)
fast.forward(ids[:, :300], torch.arange(300).unsqueeze(0), cache, logits_to_keep=1)
times = {}
for rep in range(16):
    for name in ("I", "J")[:: 1 if rep % 2 == 0 else -1]:
        apply(name)
        for width in (1, 3):
            s = time.perf_counter()
            fast.forward(
                ids[:, 300 : 300 + width], torch.arange(300, 300 + width).unsqueeze(0), cache, [1, 14, 27] if width > 1 else None
            )
            if rep:
                times.setdefault((name, width), []).append(time.perf_counter() - s)
            cache.length = 300
for name in ("I", "J"):
    t1, t3 = (1000 * statistics.median(times[(name, w)]) for w in (1, 3))
    print(f"choices of run {name}: t(1) {t1:.1f} ms, t(3) {t3:.1f} ms, t(3)/t(1) {t3 / t1:.3f}")
