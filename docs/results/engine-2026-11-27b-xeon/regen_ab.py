"""Regeneration's batched greedy generation before and after grouped prefill and amortised
row dropping, interleaved in one process.

    python docs/results/engine-2026-11-27b-xeon/regen_ab.py TARGET_DIR

TARGET_DIR: make demo's converted SmolLM2-135M-Instruct (artifacts/targets/smollm2_135m), run
in bfloat16 on the fast engine, 2 threads. 32 prompts of the demo's mix (20 code, 6 math, 6
chat; the builtin sources), 128 new tokens, 4 rounds alternating which runs first. "before"
is `greedy_batch` as of commit 1a1c6b5, read from git.
"""

import subprocess
import sys
import time

import torch

from dflash.data.builtin_prompts import builtin_rows
from dflash.data.chat import prompt_token_ids
from dflash.data.generators import HFGenerator
from dflash.specs import TargetSpec, load_target
from dflash.target import batched, engine

source = subprocess.check_output(["git", "show", "1a1c6b59fef84d5bf739fdc834574c0229748aa4:dflash/target/engine.py"], text=True)
namespace = {**vars(engine), **vars(batched)}
exec(source[source.index("def greedy_batch(") : source.index("def _ordered(")], namespace)
runs = {"before": namespace["greedy_batch"], "after": batched.greedy_batch}

torch.set_num_threads(2)
target = load_target(TargetSpec(path=sys.argv[1], dtype="bfloat16"))
rows = builtin_rows("builtin:code", 20, "x") + builtin_rows("builtin:math", 6, "x") + builtin_rows("builtin:chat", 6, "x")
generator = HFGenerator(target, max_new_tokens=128)
prompts = [prompt_token_ids(target.tokenizer, row["messages"][:1], False) for row in rows]
target.fast.prepare()
for run in runs.values():  # warm-up
    run(target.fast, prompts[:4], 4, generator.stop_ids, generator.pad_id)
totals = {name: [0, 0.0] for name in runs}
for round_ in range(4):
    outputs = {}
    for name in list(runs)[:: 1 if round_ % 2 == 0 else -1]:
        start = time.perf_counter()
        outputs[name] = runs[name](target.fast, prompts, 128, generator.stop_ids, generator.pad_id)
        seconds = time.perf_counter() - start
        tokens = sum(map(len, outputs[name]))
        totals[name][0] += tokens
        totals[name][1] += seconds
        print(f"round {round_} {name}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.0f} tok/s", flush=True)
    differ = sum(a != b for a, b in zip(outputs["before"], outputs["after"]))
    print(f"rows whose answers differ (bfloat16 rounding follows the batch's grouping): {differ} of {len(prompts)}")
for name, (tokens, seconds) in totals.items():
    print(f"{name}: {tokens / seconds:.0f} tok/s")
