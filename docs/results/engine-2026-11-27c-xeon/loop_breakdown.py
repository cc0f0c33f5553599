"""Where a decode step's time goes: the target's verify forward, the propose, acceptance and
the rest, per step, plain decoding (B = 1) against DFlash (B = 3), then a profile of one
DFlash request.

    python docs/results/engine-2026-11-27c-xeon/loop_breakdown.py DRAFTER_DIR

SmolLM2-135M-Instruct in float32 on the fast engine, 2 threads; the drafter drafts over its
draft vocabulary; the last 4 HumanEval problems, 128 new tokens, two rounds.
"""

import collections
import gzip
import json
import sys
import time

import torch
from torch.profiler import profile, record_function

from dflash.bench import target_spec
from dflash.decoding import chain, generate
from dflash.dflash.proposer import DFlashProposer
from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, humaneval_path
from dflash.specs import DrafterSpec, build_drafter, load_target

torch.set_num_threads(2)
target = load_target(target_spec("smollm2_135m", "float32", "auto"))
target.new_cache()
drafter = build_drafter(DrafterSpec(path=sys.argv[1], dtype="auto"), target)
tok = target.tokenizer
problems = [json.loads(line) for line in gzip.open(humaneval_path(), "rt")][-4:]
prompts = []
for p in problems:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": HUMANEVAL_TEMPLATE.format(text=p["prompt"])}], add_generation_prompt=True, return_tensors="pt"
    )
    prompts.append(ids if isinstance(ids, torch.Tensor) else ids["input_ids"])
prop = DFlashProposer(drafter, target.embed, target.draft_logits_over(drafter.draft_vocab), target.draft_dtype)
T = collections.defaultdict(float)


def wrap(obj, name, key):
    fn = getattr(obj, name)

    def w(*a, **k):
        s = time.perf_counter()
        r = fn(*a, **k)
        T[key] += time.perf_counter() - s
        return r

    setattr(obj, name, w)


wrap(target, "forward", "target.forward")
wrap(prop, "draft", "draft")
v = chain.ChainVerifier()
wrap(v, "accept", "accept")
wrap(v, "compact", "compact")


def run(B, ids):
    return generate(
        target,
        ids,
        max_new_tokens=128,
        block_size=B,
        proposer=prop if B > 1 else None,
        verifier=v,
        stop_token_ids=[tok.eos_token_id],
    )


run(1, prompts[0])
run(3, prompts[0])
for B in (1, 3, 1, 3):
    T.clear()
    steps = 0
    dec = 0
    pre = 0
    n = 0
    for ids in prompts:
        r = run(B, ids)
        steps += r.num_steps
        dec += r.decode_time_s
        pre += r.prefill_time_s
        n += len(r.output_ids)
    # target.forward includes the prefill forward
    tf = (T["target.forward"] - pre) * 1000 / steps
    other = dec * 1000 / steps - tf - sum(T[k] for k in ("draft", "accept", "compact")) * 1000 / steps
    print(
        f"B={B} tau {n / steps:.2f} {dec * 1000 / steps:.1f} ms/step: verify {tf:.1f}",
        {k: round(T[k] * 1000 / steps, 2) for k in ("draft", "accept", "compact")},
        f"other {other:.2f}; prefill {pre * 1000 / len(prompts):.0f} ms/prompt; tok/s {n / (dec + pre):.1f}",
    )

inner = prop.draft


def pd(*a, **k):
    with record_function("DRAFT"):
        return inner(*a, **k)


prop.draft = pd
with profile() as p:
    run(3, prompts[1])
ev = p.key_averages()
print(ev.table(sort_by="self_cpu_time_total", row_limit=30))
