"""One of our kernels as it was at REV against as it is now, both builds loaded in one
process and alternating. KIND is `linear` (`small_linear`: every linear forced to it) or
`attention` (`decode_attention`). Verify forwards t(B), B = 1, 2, 3, 4, 8, 16, after a
300-token context, median of 15 interleaved repeats per (build, B); then the kernel alone:
every weight of the model once at M = 32, 64, 256 rows (linear), or one layer's attention
at Q queries (attention).

    python docs/results/engine-2026-11-27g-amd/kernel_ab.py KIND artifacts/targets/smollm2_135m DTYPE REV
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
kind, path, dtype, rev = sys.argv[1:5]
function = {"linear": "small_linear", "attention": "decode_attention"}[kind]
csrc = "dflash/target/csrc"
old_dir = tempfile.mkdtemp()
for name in ("small_gemm.cpp", "decode_attention.cpp", "layer_ops.cpp", "vec.h"):
    with open(os.path.join(old_dir, name), "w") as f:
        f.write(subprocess.run(["git", "show", f"{rev}:{csrc}/{name}"], capture_output=True, text=True, check=True).stdout)
flags = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]
sources = [os.path.join(old_dir, n) for n in ("small_gemm.cpp", "decode_attention.cpp", "layer_ops.cpp")]
old = load("dflash_kernel_ab_old", sources, extra_cflags=flags, extra_ldflags=["-fopenmp"], build_directory=old_dir)
new = kernels.small_gemm()


class Build:
    """The built module with one function taken from another build (the rest: the new one)."""

    def __init__(self, module):
        setattr(self, function, getattr(module, function))

    def __getattr__(self, name):
        return getattr(new, name)


modules = {"before": Build(old), "after": Build(new)}
current = [modules["after"]]


def small_gemm():
    return current[0]


small_gemm.cache_info = kernels.small_gemm.cache_info
kernels.small_gemm = small_gemm  # Linear and run_attention look the module up at every call

target = load_target(target_spec(path, dtype, "fast"))
cache = target.new_cache()
linears = target.fast.linears()
if kind == "linear":
    for linear in linears:
        linear.choice = {rows: "avx512" for rows in (*kernels.TUNED_ROWS, kernels.MAX_TUNED_ROWS)}
context, widths, taps = 300, (1, 2, 3, 4, 8, 16), [1, 14, 27]
ids = torch.randint(100, 20_000, (1, context + max(widths)), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    target.forward(ids[:, :context], torch.arange(context).unsqueeze(0), cache, taps, logits_to_keep=1)

    def verify(module, width):
        def step():
            current[0] = module
            positions = torch.arange(context, context + width).unsqueeze(0)
            target.forward(ids[:, context : context + width], positions, cache, taps if width > 1 else None)
            crop_cache(cache, context)

        return step

    steps = {(name, width): verify(module, width) for name, module in modules.items() for width in widths}
    ms = interleaved_ms(steps, 15, target.device)
print(f"{dtype}, ms per verify forward (t(B)/t(1) in brackets)")
for name in modules:
    print(name, "  ".join(f"t({w}) {ms[name, w]:.2f} ({ms[name, w] / ms[name, 1]:.2f})" for w in widths))


def sweep(module, rows):
    """Every weight of the model once, as a forward streams them (prefill and batches: many rows)."""
    x = {shape: torch.randn(rows, shape, dtype=target.dtype) for shape in {linear.weight.shape[1] for linear in linears}}

    def step():
        current[0] = module
        for linear in linears:
            kernels.KERNELS["avx512"](linear, x[linear.weight.shape[1]])

    return step


def attend(module, q):
    """One layer's attention 30 times: (1, 9 heads, q, 64) over 3 kv heads of 300 keys, causal over q."""
    query = torch.randn(1, 9, q, 64, dtype=target.dtype)
    keys, values = (torch.randn(1, 3, 300, 64, dtype=target.dtype) for _ in range(2))
    mask = (torch.arange(300) <= torch.arange(300 - q, 300).unsqueeze(1)).view(1, 1, q, 300)

    def step():
        current[0] = module
        for _ in range(30):
            kernels.run_attention(query, keys, values, mask)

    return step


with torch.inference_mode():
    if kind == "linear":
        many = (32, 64, 256)
        ms = interleaved_ms({(name, m): sweep(module, m) for name, module in modules.items() for m in many}, 7, target.device)
        print(f"{dtype}, ms for every weight of the model at M rows")
        for name in modules:
            print(name, "  ".join(f"M={m} {ms[name, m]:.1f}" for m in many))
    else:
        ms = interleaved_ms({(name, q): attend(module, q) for name, module in modules.items() for q in widths}, 15, target.device)
        print(f"{dtype}, us per layer's attention (30 calls timed)")
        for name in modules:
            print(name, "  ".join(f"Q={q} {ms[name, q] * 1000 / 30:.0f}" for q in widths))
