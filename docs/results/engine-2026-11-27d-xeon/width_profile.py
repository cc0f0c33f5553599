"""Where a verify forward of 1, 3 and 8 new tokens spends its time (fast engine, after 300
positions, 2 threads; median of 10): each projection by shape and chosen kernel, our attention
kernel, the fused norms and SiLU, and the rest.

    python docs/results/engine-2026-11-27d-xeon/width_profile.py [float32|bfloat16]

Run from the repository root after `make demo` (artifacts/targets/smollm2_135m).
"""

import collections
import sys
import time

import torch

from dflash.specs import TargetSpec, load_target
from dflash.target import engine, kernels

torch.set_num_threads(2)

dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
target = load_target(TargetSpec(path="artifacts/targets/smollm2_135m", dtype=dtype))
fast = target.fast
fast.prepare()
T = collections.defaultdict(float)
oc = kernels.Linear.__call__


def lc(self, x):
    s = time.perf_counter()
    r = oc(self, x)
    T[f"linear {tuple(self.weight.shape)} {self.choice.get(kernels._bucket(x.numel() // x.shape[-1]), 'dense')}"] += (
        time.perf_counter() - s
    )
    return r


kernels.Linear.__call__ = lc
for name in ("run_attention", "attention_plan", "add_rms_norm", "silu_mul"):
    fn = getattr(engine, name)

    def w(*a, fn=fn, name=name, **k):
        s = time.perf_counter()
        r = fn(*a, **k)
        T[name] += time.perf_counter() - s
        return r

    setattr(engine, name, w)
ids = torch.randint(100, 20000, (1, 316))
cache = fast.new_cache(capacity=400)
fast.forward(ids[:, :300], torch.arange(300).unsqueeze(0), cache, logits_to_keep=1)
res = {}
for rep in range(12):
    for width in (1, 3, 8):
        T.clear()
        s = time.perf_counter()
        fast.forward(
            ids[:, 300 : 300 + width], torch.arange(300, 300 + width).unsqueeze(0), cache, [1, 14, 27] if width > 1 else None
        )
        tot = time.perf_counter() - s
        cache.length = 300
        if rep >= 2:
            res.setdefault(width, []).append((tot, dict(T)))
for width, v in res.items():
    v.sort(key=lambda x: x[0])
    tot, parts = v[len(v) // 2]
    print(
        f"t({width}) {tot * 1000:.1f} ms: "
        + ", ".join(f"{k} {1000 * t:.2f}" for k, t in sorted(parts.items(), key=lambda kv: -kv[1]))
        + f", rest {1000 * (tot - sum(parts.values())):.2f}"
    )
