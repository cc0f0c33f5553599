"""Verify forwards t(B) of the float32 (or bfloat16) target on the fast engine with our
decode attention as it was at REV (one task per (batch row, kv head)) and as it is now
(3 kv heads on 2 threads: each head's query rows in 2 parts), both modules loaded in one
process and alternating: B = 1, 2, 3, 4, 8, 16 after a 300-token context, median of 15
interleaved repeats per (module, B); then the attention of one layer alone.

    python docs/results/engine-2026-11-27g-amd/split_ab.py artifacts/targets/smollm2_135m float32 REV
"""

import os
import subprocess
import sys
import tempfile

import torch
from torch.utils.cpp_extension import load

from dflash.bench import target_spec
from dflash.specs import load_target
from dflash.target import crop_cache, kernels
from dflash.timing import interleaved_ms

torch.set_num_threads(2)
path, dtype, rev = sys.argv[1], sys.argv[2], sys.argv[3]
csrc = "dflash/target/csrc"
old_dir = tempfile.mkdtemp()
for name in ("small_gemm.cpp", "decode_attention.cpp", "layer_ops.cpp", "vec.h"):
    with open(os.path.join(old_dir, name), "w") as f:
        f.write(subprocess.run(["git", "show", f"{rev}:{csrc}/{name}"], capture_output=True, text=True, check=True).stdout)
flags = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]
sources = [os.path.join(old_dir, n) for n in ("small_gemm.cpp", "decode_attention.cpp", "layer_ops.cpp")]
old = load("dflash_split_ab_old", sources, extra_cflags=flags, extra_ldflags=["-fopenmp"], build_directory=old_dir)
new = kernels.small_gemm()


class Linears:
    """The built module with `decode_attention` taken from another build (the rest: the new one)."""

    def __init__(self, module):
        self.decode_attention = module.decode_attention

    def __getattr__(self, name):
        return getattr(new, name)


modules = {"before": Linears(old), "after": Linears(new)}
current = [modules["after"]]


def small_gemm():
    return current[0]


small_gemm.cache_info = kernels.small_gemm.cache_info
kernels.small_gemm = small_gemm

target = load_target(target_spec(path, dtype, "fast"))
cache = target.new_cache()
context, widths, taps = 300, (1, 2, 3, 4, 8, 16), [1, 14, 27]
ids = torch.randint(100, 20_000, (1, context + max(widths)), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    target.forward(ids[:, :context], torch.arange(context).unsqueeze(0), cache, taps, logits_to_keep=1)

    def verify(module, width):
        def step():
            current[0] = module  # run_attention looks the module up at every call
            positions = torch.arange(context, context + width).unsqueeze(0)
            target.forward(ids[:, context : context + width], positions, cache, taps if width > 1 else None)
            crop_cache(cache, context)

        return step

    steps = {(name, width): verify(module, width) for name, module in modules.items() for width in widths}
    ms = interleaved_ms(steps, 15, target.device)
print(f"{dtype}, ms per verify forward (t(B)/t(1) in brackets)")
for name in modules:
    print(name, "  ".join(f"t({w}) {ms[name, w]:.2f} ({ms[name, w] / ms[name, 1]:.2f})" for w in widths))


# One layer's attention alone: (1, 9 heads, Q, 64) over 3 kv heads of 300 keys, causal over Q.
def attend(module, q):
    query = torch.randn(1, 9, q, 64, dtype=target.dtype)
    keys, values = (torch.randn(1, 3, 300, 64, dtype=target.dtype) for _ in range(2))
    mask = (torch.arange(300) <= torch.arange(300 - q, 300).unsqueeze(1)).view(1, 1, q, 300)

    def step():
        current[0] = module
        for _ in range(30):
            kernels.run_attention(query, keys, values, mask)

    return step


with torch.inference_mode():
    ms = interleaved_ms({(name, q): attend(module, q) for name, module in modules.items() for q in widths}, 15, target.device)
print(f"{dtype}, us per layer's attention (30 calls timed)")
for name in modules:
    print(name, "  ".join(f"Q={q} {ms[name, q] * 1000 / 30:.0f}" for q in widths))
