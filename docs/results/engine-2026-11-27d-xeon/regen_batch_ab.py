"""Regeneration's data stage at several batch sizes, interleaved in one process.

    python docs/results/engine-2026-11-27d-xeon/regen_batch_ab.py TARGET_DIR [PROMPTS] [ROUNDS] [BATCHxSHARD,...]

TARGET_DIR: make demo's converted SmolLM2-135M-Instruct, run in bfloat16 on the fast engine,
2 threads. PROMPTS (default 256) of the demo's mix in its order (3/5 code, 1/5 math, 1/5 chat,
source by source), cut into shards and each shard sorted by characters as
`dflash.data.regenerate` does, 128 new tokens; configurations default to 64x128,128x128,128x256. Prints tokens/s per (batch, shard) and checks
that every configuration gives the same answers.
"""

import sys
import time

import torch

from dflash.data.builtin_prompts import builtin_rows
from dflash.data.chat import prompt_token_ids
from dflash.data.generators import HFGenerator
from dflash.specs import TargetSpec, load_target
from dflash.target import batched

torch.set_num_threads(2)
count = int(sys.argv[2]) if len(sys.argv) > 2 else 256
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
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
chosen = sys.argv[4] if len(sys.argv) > 4 else "64x128,128x128,128x256"
configs = [tuple(int(n) for n in config.split("x")) for config in chosen.split(",")]


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


batched.greedy_batch(target.fast, prompts[:4], 4, generator.stop_ids, generator.pad_id)  # warm-up
totals = {config: [0, 0.0] for config in configs}
answers = {}
for round_ in range(rounds):
    for config in configs[:: 1 if round_ % 2 == 0 else -1]:
        start = time.perf_counter()
        answers[config] = regenerate(*config)
        seconds = time.perf_counter() - start
        tokens = sum(map(len, answers[config]))
        totals[config][0] += tokens
        totals[config][1] += seconds
        print(
            f"round {round_} batch {config[0]} of shards of {config[1]}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.0f} tok/s",
            flush=True,
        )
same = all(answers[config] == answers[configs[0]] for config in configs)
for config, (tokens, seconds) in totals.items():
    print(f"batch {config[0]} of shards of {config[1]}: {tokens / seconds:.0f} tok/s over {rounds} rounds")
print("the same answers in every configuration:", same)
