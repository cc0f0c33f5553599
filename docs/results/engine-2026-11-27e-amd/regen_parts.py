"""Where one batch of regeneration spends its time: the first 128 prompts of a demo data shard,
bfloat16, 128 new tokens, as `greedy_batch` runs them at the checkout (profiles.log names the
commit of each run), each projection, SDPA, our attention kernel and the fused ops timed
inside the prefill and the decode steps (seconds).

    python docs/results/engine-2026-11-27e-amd/regen_parts.py SHARD.jsonl
"""

import collections
import json
import sys
import time

import torch
import torch.nn.functional as F

from dflash.specs import TargetSpec, load_target
from dflash.target import batched, engine, kernels

torch.set_num_threads(2)
target = load_target(TargetSpec(path="artifacts/targets/smollm2_135m", dtype="bfloat16"))
fast = target.fast
fast.prepare()
prompts = [json.loads(line)["token_ids"]["prompt"] for line in open(sys.argv[1])][:128]
parts, whole, phase = collections.defaultdict(float), collections.defaultdict(float), ["prefill"]


def timed(name, fn):
    def run(*args, **kwargs):
        s = time.perf_counter()
        out = fn(*args, **kwargs)
        parts[(phase[0], name(*args) if callable(name) else name)] += time.perf_counter() - s
        return out

    return run


kernels.Linear.__call__ = timed(lambda self, x: f"linear {tuple(self.weight.shape)}", kernels.Linear.__call__)
for op in ("run_attention", "attention_plan", "add_rms_norm", "silu_mul"):
    setattr(engine, op, timed(op, getattr(engine, op)))
batched.argmax = timed("argmax", batched.argmax)
F.scaled_dot_product_attention = timed("sdpa", F.scaled_dot_product_attention)
forward = fast.forward


def phased(*args, **kwargs):
    phase[0] = "prefill" if args[0].shape[1] > 1 else "decode"
    s = time.perf_counter()
    out = forward(*args, **kwargs)
    whole[phase[0]] += time.perf_counter() - s
    return out


fast.forward = phased
with torch.inference_mode():
    batched.greedy_batch(fast, prompts[:4], 4, {2}, 0)  # warm-up
    parts.clear()
    whole.clear()
    s = time.perf_counter()
    out = batched.greedy_batch(fast, prompts, 128, {2}, 0)
    total = time.perf_counter() - s
tokens = sum(len(o) for o in out)
print(f"{tokens} new tokens in {total:.1f} s: {tokens / total:.0f} tok/s")
for name in ("prefill", "decode"):
    mine = sorted(((k[1], v) for k, v in parts.items() if k[0] == name), key=lambda kv: -kv[1])
    rest = whole[name] - sum(v for _, v in mine)
    print(f"{name} {whole[name]:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in mine) + f", rest {rest:.2f}")
