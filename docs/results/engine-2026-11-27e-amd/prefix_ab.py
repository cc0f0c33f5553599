"""Regeneration with and without the prompts' shared start run once (batched.shared_prefix),
on the first 128 prompts of demo data shards, bfloat16, 128 new tokens, the two alternating
in one process (off, on, on, off per shard).

    python docs/results/engine-2026-11-27e-amd/prefix_ab.py SHARD.jsonl [SHARD.jsonl ...]

Run from the repository root after `make demo` (artifacts/targets/smollm2_135m; the shards
are the demo's artifacts/demo/smollm2-data-*/rows-*.jsonl).
"""

import json
import sys
import time

import torch

from dflash.specs import TargetSpec, load_target
from dflash.target import batched

torch.set_num_threads(2)
target = load_target(TargetSpec(path="artifacts/targets/smollm2_135m", dtype="bfloat16"))
fast = target.fast
fast.prepare()
shards = sys.argv[1:]
real = batched.shared_prefix


def run(prompts, on):
    batched.shared_prefix = real if on else (lambda p: 0)
    s = time.perf_counter()
    out = batched.greedy_batch(fast, prompts, 128, {2}, 0)
    return out, time.perf_counter() - s


with torch.inference_mode():
    run([json.loads(line)["token_ids"]["prompt"] for line in open(shards[0])][:4], True)  # warm-up
    total = {True: [0, 0.0], False: [0, 0.0]}
    for f in shards:
        prompts = [json.loads(line)["token_ids"]["prompt"] for line in open(f)][:128]
        res = {}
        for on in (False, True, True, False):
            out, sec = run(prompts, on)
            n = sum(map(len, out))
            total[on][0] += n
            total[on][1] += sec
            res.setdefault(on, []).append(out)
            print(f"{f.rsplit('/', 1)[-1]} shared={on}: {n} tokens {sec:.1f} s {n / sec:.0f} tok/s (prefix {real(prompts)})")
        same = sum(a == b for a, b in zip(res[True][0], res[False][0]))
        print(f"  identical answers with/without: {same}/{len(prompts)}")
for on in (False, True):
    print(f"shared={on}: {total[on][0] / total[on][1]:.0f} tok/s")
