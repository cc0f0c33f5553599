"""Our argmax and the drafter's fused head norm + rotary against the code before them
(commit ea6dab0: torch's argmax, PyTorch's q/k norm and rotary in the drafter), interleaved
in one process. Run from a git checkout (the "before" drafter forward is read from ea6dab0).

    python docs/results/engine-2026-11-27d-xeon/propose_ab.py TARGET_DIR DRAFTER_DIR

TARGET_DIR: make demo's converted SmolLM2-135M-Instruct; DRAFTER_DIR: make demo's drafter.
2 threads. Prints, before against after:
1. one propose of the drafter (median over a HumanEval request's proposes, replayed);
2. regeneration (bfloat16): 128 prompts of the demo's mix, sorted by length, batches of 64,
   128 new tokens, 2 alternating rounds;
3. the decode loop (float32): plain decoding and DFlash (block 3) on the last 6 HumanEval
   problems, 128 new tokens, alternating per prompt, all four outputs the same tokens.
"""

import gzip
import json
import statistics
import subprocess
import sys
import time
import types

import torch

from dflash.data.builtin_prompts import builtin_rows
from dflash.data.chat import prompt_token_ids
from dflash.data.generators import HFGenerator
from dflash.decoding import generate, loop, verify
from dflash.dflash.proposer import DFlashProposer
from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, humaneval_path
from dflash.specs import DrafterSpec, TargetSpec, build_drafter, load_target
from dflash.target import batched, kernels

torch.set_num_threads(2)
before_source = subprocess.run(["git", "show", "ea6dab0:dflash/drafter/fast.py"], capture_output=True, text=True, check=True)
fast_before = types.ModuleType("fast_before")
exec(compile(before_source.stdout, "fast_before.py", "exec"), fast_before.__dict__)


def torch_argmax(logits):
    return logits.argmax(-1)


def use(name):
    chosen = kernels.argmax if name == "after" else torch_argmax
    batched.argmax = verify.argmax = loop.argmax = chosen


def proposer(name, target, drafter):
    made = DFlashProposer(drafter, target.embed, target.draft_logits_over(drafter.draft_vocab), target.draft_dtype)
    if name == "before":
        made.forward = fast_before.FastDrafter(made.drafter, target.draft_dtype)
    return made


def humaneval_prompts(tokenizer, count):
    prompts = []
    for problem in [json.loads(line) for line in gzip.open(humaneval_path(), "rt")][-count:]:
        text = HUMANEVAL_TEMPLATE.format(text=problem["prompt"])
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
        prompts.append(ids if isinstance(ids, torch.Tensor) else ids["input_ids"])
    return prompts


def proposes(target, drafter):
    made = {name: proposer(name, target, drafter) for name in ("before", "after")}
    calls = []
    record = made["after"].propose
    made["after"].propose = lambda *args: calls.append([a.clone() if torch.is_tensor(a) else a for a in args]) or record(*args)
    prompt = humaneval_prompts(target.tokenizer, 1)[0]
    generate(
        target, prompt, max_new_tokens=128, block_size=3, proposer=made["after"], stop_token_ids=[target.tokenizer.eos_token_id]
    )
    made["after"].propose = record
    times = {"before": [], "after": []}
    for repeat in range(6):
        for name in ("before", "after")[:: 1 if repeat % 2 == 0 else -1]:
            use(name)
            made[name].reset()
            for index, args in enumerate(calls):
                start = time.perf_counter()
                verify.propose_tokens(made[name].propose(*args), loop.SamplingConfig(), None)
                if index and repeat:  # the first propose reads the whole prompt; the first round warms up
                    times[name].append(time.perf_counter() - start)
    before, after = (1000 * statistics.median(times[name]) for name in ("before", "after"))
    print(f"propose (block 3, {len(calls)} per request): before {before:.2f} ms, after {after:.2f} ms", flush=True)


def regeneration():
    target = load_target(TargetSpec(path=sys.argv[1], dtype="bfloat16"))
    target.fast.prepare()
    rows = builtin_rows("builtin:code", 77, "x") + builtin_rows("builtin:math", 26, "x") + builtin_rows("builtin:chat", 25, "x")
    generator = HFGenerator(target, max_new_tokens=128)
    prompts = sorted((prompt_token_ids(target.tokenizer, row["messages"][:1], False) for row in rows), key=len)
    totals = {"before": [0, 0.0], "after": [0, 0.0]}
    outputs = {}
    for round_ in range(2):
        for name in ("before", "after")[:: 1 if round_ % 2 == 0 else -1]:
            use(name)
            start = time.perf_counter()
            done = []
            for first in range(0, len(prompts), 64):
                done += batched.greedy_batch(target.fast, prompts[first : first + 64], 128, generator.stop_ids, generator.pad_id)
            totals[name][0] += sum(map(len, done))
            totals[name][1] += time.perf_counter() - start
            outputs.setdefault(name, done)
    assert outputs["before"] == outputs["after"]
    before, after = (tokens / seconds for tokens, seconds in totals.values())
    print(
        f"regeneration bfloat16, batch 64: before {before:.0f} tok/s, after {after:.0f} tok/s ({after / before:.2f}x)", flush=True
    )


def decode_loop(target, drafter):
    totals = {}
    for index, ids in enumerate(humaneval_prompts(target.tokenizer, 6)):
        outputs = []
        for name in ("before", "after")[:: 1 if index % 2 == 0 else -1]:
            use(name)
            made = proposer(name, target, drafter)
            for block in (1, 3):
                result = generate(
                    target, ids, max_new_tokens=128, block_size=block, proposer=made, stop_token_ids=[target.tokenizer.eos_token_id]
                )
                if index:  # the first problem warms up
                    entry = totals.setdefault((name, block), [0, 0.0])
                    entry[0] += len(result.output_ids)
                    entry[1] += result.total_time_s
                outputs.append(result.output_ids)
        assert all(output == outputs[0] for output in outputs)
    speed = {key: tokens / seconds for key, (tokens, seconds) in totals.items()}
    for block, label in ((1, "plain"), (3, "DFlash")):
        before, after = speed[("before", block)], speed[("after", block)]
        print(f"decode loop float32 {label}: before {before:.2f} tok/s, after {after:.2f} tok/s ({after / before:.2f}x)")
    for name in ("before", "after"):
        print(f"  DFlash over plain, {name}: {speed[(name, 3)] / speed[(name, 1)]:.3f}")


float32 = load_target(TargetSpec(path=sys.argv[1], dtype="float32"))
float32.new_cache()
drafter = build_drafter(DrafterSpec(path=sys.argv[2], dtype="auto"), float32)
proposes(float32, drafter)
decode_loop(float32, drafter)
del float32
regeneration()
