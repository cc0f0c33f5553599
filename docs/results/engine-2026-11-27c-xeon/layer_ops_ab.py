"""The engine with and without our fused layer ops (dflash/target/csrc/layer_ops.cpp),
interleaved in one process.

    python docs/results/engine-2026-11-27c-xeon/layer_ops_ab.py TARGET_DIR DRAFTER_DIR

TARGET_DIR: make demo's converted SmolLM2-135M-Instruct; DRAFTER_DIR: make demo's drafter
(with its draft_vocab.json). 2 threads. Prints, PyTorch's ops ("torch") against ours ("ours"):
1. the target's forward over B = 1, 3, 8 new tokens after 300 positions (fast engine, median
   of 15 alternating repeats), in float32 and in bfloat16;
2. regeneration (bfloat16): 128 prompts of the demo's mix, sorted by length, batches of 64,
   128 new tokens, 2 alternating rounds;
3. the decode loop (float32): plain decoding and DFlash (block 3) on the last 6 HumanEval
   problems, 128 new tokens, alternating per prompt, all four outputs the same tokens.
"""

import gzip
import json
import statistics
import sys
import time

import torch

from dflash.bench import target_spec
from dflash.data.builtin_prompts import builtin_rows
from dflash.data.chat import prompt_token_ids
from dflash.data.generators import HFGenerator
from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import fast as fast_drafter
from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, humaneval_path
from dflash.specs import DrafterSpec, TargetSpec, build_drafter, load_target
from dflash.target import batched, engine, kernels

torch.set_num_threads(2)
ours = kernels.layer_ops


def use(name):
    chosen = ours if name == "ours" else (lambda like: None)
    engine.layer_ops = chosen
    fast_drafter.layer_ops = chosen


def forwards(dtype):
    target = load_target(TargetSpec(path=sys.argv[1], dtype=dtype))
    fast = target.fast
    fast.prepare()
    ids = torch.randint(100, 20_000, (1, 308), generator=torch.Generator().manual_seed(0))
    cache = fast.new_cache()
    fast.forward(ids[:, :300], torch.arange(300).unsqueeze(0), cache, logits_to_keep=1)
    times = {}
    for repeat in range(16):
        for name in ("torch", "ours")[:: 1 if repeat % 2 == 0 else -1]:
            use(name)
            for width in (1, 3, 8):
                taps = [1, 15, 29] if width > 1 else None
                start = time.perf_counter()
                fast.forward(ids[:, 300 : 300 + width], torch.arange(300, 300 + width).unsqueeze(0), cache, taps)
                if repeat:  # the first is a warm-up
                    times.setdefault((name, width), []).append(time.perf_counter() - start)
                cache.length = 300
    for width in (1, 3, 8):
        before, after = (1000 * statistics.median(times[(name, width)]) for name in ("torch", "ours"))
        print(f"{dtype} t({width}): torch {before:.1f} ms, ours {after:.1f} ms ({before / after:.2f}x)", flush=True)


def regeneration():
    target = load_target(TargetSpec(path=sys.argv[1], dtype="bfloat16"))
    target.fast.prepare()
    rows = builtin_rows("builtin:code", 77, "x") + builtin_rows("builtin:math", 26, "x") + builtin_rows("builtin:chat", 25, "x")
    generator = HFGenerator(target, max_new_tokens=128)
    prompts = sorted((prompt_token_ids(target.tokenizer, row["messages"][:1], False) for row in rows), key=len)
    totals = {"torch": [0, 0.0], "ours": [0, 0.0]}
    for round_ in range(2):
        for name in ("torch", "ours")[:: 1 if round_ % 2 == 0 else -1]:
            use(name)
            start = time.perf_counter()
            for first in range(0, len(prompts), 64):
                out = batched.greedy_batch(target.fast, prompts[first : first + 64], 128, generator.stop_ids, generator.pad_id)
                totals[name][0] += sum(map(len, out))
            totals[name][1] += time.perf_counter() - start
    before, after = (tokens / seconds for tokens, seconds in totals.values())
    print(f"regeneration bfloat16, batch 64: torch {before:.0f} tok/s, ours {after:.0f} tok/s ({after / before:.2f}x)", flush=True)


def decode_loop():
    target = load_target(target_spec("smollm2_135m", "float32", "auto"))
    target.new_cache()
    drafter = build_drafter(DrafterSpec(path=sys.argv[2], dtype="auto"), target)
    tokenizer = target.tokenizer
    problems = [json.loads(line) for line in gzip.open(humaneval_path(), "rt")][-6:]
    totals = {}
    for index, problem in enumerate(problems):
        text = HUMANEVAL_TEMPLATE.format(text=problem["prompt"])
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        outputs = []
        for name in ("torch", "ours")[:: 1 if index % 2 == 0 else -1]:
            use(name)  # the proposer is built under the ops it measures
            proposer = DFlashProposer(drafter, target.embed, target.draft_logits_over(drafter.draft_vocab), target.draft_dtype)
            for block in (1, 3):
                result = generate(
                    target, ids, max_new_tokens=128, block_size=block, proposer=proposer, stop_token_ids=[tokenizer.eos_token_id]
                )
                if index:  # the first problem warms up
                    entry = totals.setdefault((name, block), [0, 0.0])
                    entry[0] += len(result.output_ids)
                    entry[1] += result.total_time_s
                outputs.append(result.output_ids)
        assert all(output == outputs[0] for output in outputs)
    for block in (1, 3):
        before, after = (totals[(name, block)][0] / totals[(name, block)][1] for name in ("torch", "ours"))
        label = "plain" if block == 1 else "DFlash"
        print(f"decode loop float32 {label}: torch {before:.2f} tok/s, ours {after:.2f} tok/s ({after / before:.2f}x)")
    for name in ("torch", "ours"):
        print(
            f"  speed-up of DFlash over plain with {name}'s ops: {totals[(name, 3)][0] / totals[(name, 3)][1] / (totals[(name, 1)][0] / totals[(name, 1)][1]):.3f}"
        )


forwards("float32")
forwards("bfloat16")
regeneration()
decode_loop()
