"""Regeneration's data stage before and after (attention that skips each row's left padding;
batches of 64 from shards of 128 instead of 32 from 64), interleaved in one process.

    python docs/results/engine-2026-11-27c-xeon/regen_batch_ab.py TARGET_DIR [PROMPTS] [ROUNDS]

TARGET_DIR: make demo's converted SmolLM2-135M-Instruct, run in bfloat16 on the fast engine,
2 threads. PROMPTS (default 256) of the demo's mix in its order (3/5 code, 1/5 math, 1/5 chat,
source by source), cut into shards and each shard sorted by characters as
`dflash.data.regenerate` does, 128 new tokens. "old attention" is
dflash/target/csrc/decode_attention.cpp as of commit abf88b4, read from git and built here.
"""

import os
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.cpp_extension import load

from dflash.data.builtin_prompts import builtin_rows
from dflash.data.chat import prompt_token_ids
from dflash.data.generators import HFGenerator
from dflash.specs import TargetSpec, load_target
from dflash.target import batched, kernels

torch.set_num_threads(2)
count = int(sys.argv[2]) if len(sys.argv) > 2 else 256
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
new_module = kernels.small_gemm()
old_dir = tempfile.mkdtemp()
for name in ("small_gemm.cpp", "decode_attention.cpp"):
    text = subprocess.check_output(["git", "show", f"abf88b4:dflash/target/csrc/{name}"], text=True)
    with open(os.path.join(old_dir, name), "w") as f:
        f.write(text)
flags = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]
old_module = load(
    "dflash_small_gemm_abf88b4",
    [os.path.join(old_dir, n) for n in ("small_gemm.cpp", "decode_attention.cpp")],
    extra_cflags=flags,
    extra_ldflags=["-fopenmp"],
    build_directory=old_dir,
)

target = load_target(TargetSpec(path=sys.argv[1], dtype="bfloat16"))
code, other = count * 3 // 5, count // 5
rows = (
    builtin_rows("builtin:code", code, "x")
    + builtin_rows("builtin:math", other, "x")
    + builtin_rows("builtin:chat", count - code - other, "x")
)
messages = [row["messages"][:1] for row in rows]
generator = HFGenerator(target, max_new_tokens=128)
prompts = [prompt_token_ids(target.tokenizer, m, False) for m in messages]
chars = [sum(len(x["content"]) for x in m) for m in messages]
target.fast.prepare()
configs = {
    "old attention, batch 32 of shards of 64": (old_module, 32, 64),
    "new attention, batch 32 of shards of 64": (new_module, 32, 64),
    "new attention, batch 64 of shards of 128": (new_module, 64, 128),
}


def regenerate(batch, shard):
    answers = [None] * len(prompts)
    for start in range(0, len(prompts), shard):
        order = sorted(range(start, min(start + shard, len(prompts))), key=lambda i: chars[i])
        for first in range(0, len(order), batch):
            rows_ = order[first : first + batch]
            for i, out in zip(
                rows_, batched.greedy_batch(target.fast, [prompts[i] for i in rows_], 128, generator.stop_ids, generator.pad_id)
            ):
                answers[i] = out
    return answers


for module, _, _ in configs.values():  # warm-up
    kernels.small_gemm = lambda module=module: module
    batched.greedy_batch(target.fast, prompts[:4], 4, generator.stop_ids, generator.pad_id)
totals = {name: [0, 0.0] for name in configs}
for round_ in range(rounds):
    for name in list(configs)[:: 1 if round_ % 2 == 0 else -1]:
        module, batch, shard = configs[name]
        kernels.small_gemm = lambda module=module: module
        start = time.perf_counter()
        answers = regenerate(batch, shard)
        seconds = time.perf_counter() - start
        tokens = sum(map(len, answers))
        totals[name][0] += tokens
        totals[name][1] += seconds
        print(f"round {round_} {name}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.0f} tok/s", flush=True)
for name, (tokens, seconds) in totals.items():
    print(f"{name}: {tokens / seconds:.0f} tok/s over {rounds} rounds")
