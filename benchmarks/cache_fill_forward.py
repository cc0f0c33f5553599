"""The disk cache fill's forward on a right-padded batch of B x S random tokens: transformers'
forward of the float32 target under CPU autocast to bfloat16 (what the fill runs) against the
fast engine on a bfloat16 copy, alternating, best of 3; first the largest difference between
their tapped features.

    python benchmarks/cache_fill_forward.py artifacts/targets/smollm2_135m 8 256
"""

import sys
import time

import torch

from dflash.bench import target_spec
from dflash.specs import load_target
from dflash.training.forward import target_features

torch.set_num_threads(2)
path, batch, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
full = load_target(target_spec(path, "float32", "fast"))
half = load_target(target_spec(path, "bfloat16", "fast"))
half.fast.prepare()
taps = [1, 14, 27]
ids = torch.randint(100, 40000, (batch, width))


def autocast_forward():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return target_features(full, ids, taps)


def fast_forward():
    cache = half.fast.new_cache(batch=batch, capacity=width)
    positions = torch.arange(width).expand(batch, width)
    return half.fast.forward(ids, positions, cache, taps, logits_to_keep=1)[1]


a, b = autocast_forward().float(), fast_forward().float()
print("largest difference / largest state:", float((a - b).abs().max() / a.abs().max()))
times = {"autocast": [], "fast": []}
for _ in range(3):
    for name, forward in (("autocast", autocast_forward), ("fast", fast_forward)):
        start = time.perf_counter()
        forward()
        times[name].append(time.perf_counter() - start)
for name, seconds in times.items():
    print(f"{name}: {min(seconds):.2f} s, {batch * width / min(seconds):.0f} tokens/s")
