"""Verify forwards t(B) of the float32 (or bfloat16) target on the fast engine with our
AVX-512 linear kernel as it was at REV (no prefetch of the next tile) and as it is now,
both modules loaded in one process and alternating: B = 1, 2, 3, 4, 8, 16 after a
300-token context, median of 15 interleaved repeats per (module, B), every linear forced
to our kernel.

    python docs/results/engine-2026-11-27g-amd/ahead_ab.py artifacts/targets/smollm2_135m float32 REV
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
old = load("dflash_ahead_ab_old", sources, extra_cflags=flags, extra_ldflags=["-fopenmp"], build_directory=old_dir)
new = kernels.small_gemm()


class Linears:
    """The built module with `small_linear` taken from another build (the rest: the new one)."""

    def __init__(self, module):
        self.small_linear = module.small_linear

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
for linear in target.fast.linears():
    linear.choice = {rows: "avx512" for rows in (*kernels.TUNED_ROWS, kernels.MAX_TUNED_ROWS)}
context, widths, taps = 300, (1, 2, 3, 4, 8, 16), [1, 14, 27]
ids = torch.randint(100, 20_000, (1, context + max(widths)), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    target.forward(ids[:, :context], torch.arange(context).unsqueeze(0), cache, taps, logits_to_keep=1)

    def verify(module, width):
        def step():
            current[0] = module  # Linear looks the module up at every call
            positions = torch.arange(context, context + width).unsqueeze(0)
            target.forward(ids[:, context : context + width], positions, cache, taps if width > 1 else None)
            crop_cache(cache, context)

        return step

    steps = {(name, width): verify(module, width) for name, module in modules.items() for width in widths}
    ms = interleaved_ms(steps, 15, target.device)
print(f"{dtype}, ms per verify forward (t(B)/t(1) in brackets)")
for name in modules:
    print(name, "  ".join(f"t({w}) {ms[name, w]:.2f} ({ms[name, w] / ms[name, 1]:.2f})" for w in widths))

# Prefill and batched regeneration run the same kernel on many rows: every weight of the
# model once (as a forward streams them) at M rows, median of 7 interleaved repeats.
linears = target.fast.linears()


def sweep(module, rows):
    x = {shape: torch.randn(rows, shape, dtype=target.dtype) for shape in {linear.weight.shape[1] for linear in linears}}

    def step():
        current[0] = module
        for linear in linears:
            kernels.KERNELS["avx512"](linear, x[linear.weight.shape[1]])

    return step


many = (32, 64, 256)
with torch.inference_mode():
    ms = interleaved_ms({(name, m): sweep(module, m) for name, module in modules.items() for m in many}, 7, target.device)
print(f"{dtype}, ms for every weight of the model at M rows")
for name in modules:
    print(name, "  ".join(f"M={m} {ms[name, m]:.1f}" for m in many))
