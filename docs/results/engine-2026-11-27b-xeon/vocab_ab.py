"""The decode loop drafting over the whole vocabulary against the drafter's draft vocabulary,
in one process.

    python docs/results/engine-2026-11-27b-xeon/vocab_ab.py DRAFTER_DIR HELDOUT.jsonl [N]

SmolLM2-135M-Instruct in float32 on the fast engine, 2 threads, the lean bfloat16 propose;
DRAFTER_DIR must hold a draft_vocab.json. The first N (6) prompts of a held-out file of
`make demo` (`heldout_chat.jsonl`, `heldout_math.jsonl`) or HumanEval (`humaneval`: its last
N problems), 2 rounds, 128 new tokens. Per prompt it runs plain decoding, DFlash (block 3)
over the whole vocabulary and over the draft vocabulary, in alternating order, and checks
that all three outputs are the same tokens. Prints tokens/s (prefill included), time per
step, tau, and both speed-ups over plain decoding."""

import gzip
import json
import sys

import torch

from dflash.bench import target_spec
from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, humaneval_path
from dflash.specs import DrafterSpec, build_drafter, load_target

torch.set_num_threads(2)
target = load_target(target_spec("smollm2_135m", "float32", "auto"))
target.new_cache()
drafter = build_drafter(DrafterSpec(path=sys.argv[1], dtype="auto"), target)
assert drafter.draft_vocab is not None, "the drafter directory has no draft_vocab.json"
count = int(sys.argv[3]) if len(sys.argv) > 3 else 6
if sys.argv[2] == "humaneval":
    problems = [json.loads(line) for line in gzip.open(humaneval_path(), "rt")][-count:]
    prompts = [HUMANEVAL_TEMPLATE.format(text=row["prompt"]) for row in problems]
else:
    prompts = [json.loads(line)["turns"][0] for line in open(sys.argv[2])][:count]
tokenizer = target.tokenizer
proposers = {
    "whole": DFlashProposer(drafter, target.embed, target.draft_logits, target.draft_dtype),
    "vocab": DFlashProposer(drafter, target.embed, target.draft_logits_over(drafter.draft_vocab), target.draft_dtype),
}
names = ("plain", *proposers)
stops = [tokenizer.eos_token_id]


def prompt_ids(text):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def run(name, ids):
    if name == "plain":
        return generate(target, ids, max_new_tokens=128, stop_token_ids=stops)
    return generate(target, ids, max_new_tokens=128, block_size=3, proposer=proposers[name], stop_token_ids=stops)


for name in names:  # warm-up
    run(name, prompt_ids(prompts[0]))
totals = {name: [0, 0.0, 0] for name in names}
for round_ in range(2):
    for index, text in enumerate(prompts):
        ids = prompt_ids(text)
        order = list(names) if (index + round_) % 2 == 0 else list(reversed(names))
        outputs = {}
        for name in order:
            result = run(name, ids)
            outputs[name] = result.output_ids
            totals[name][0] += len(result.output_ids)
            totals[name][1] += result.total_time_s
            totals[name][2] += result.num_steps
        assert outputs["whole"] == outputs["plain"] == outputs["vocab"]
for name, (tokens, seconds, steps) in totals.items():
    print(f"{name}: {tokens / seconds:.2f} tok/s, {1000 * seconds / steps:.1f} ms/step, tau {tokens / steps:.3f}")
plain = totals["plain"][0] / totals["plain"][1]
print(" ".join(f"speedup {name} {totals[name][0] / totals[name][1] / plain:.3f}" for name in proposers))
