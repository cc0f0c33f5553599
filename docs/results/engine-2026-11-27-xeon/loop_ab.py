"""The decode loop with a drafter through its module against its lean forward, in one process.

    python docs/results/engine-2026-11-27-xeon/loop_ab.py DRAFTER_DIR HELDOUT.jsonl

SmolLM2-135M-Instruct in float32 on the fast engine, 2 threads; the first 6 prompts of a
held-out file of `make demo` (`heldout_chat.jsonl`, `heldout_math.jsonl`), 2 rounds, 128 new
tokens. Per prompt it runs plain decoding, DFlash (block 3) through the module and DFlash
through the lean forward (`dflash.drafter.fast`), in alternating order, and checks that all
three outputs are the same tokens. Prints tokens/s (total time, prefill included), time per
step and tau of each, and both speed-ups over plain decoding."""

import json
import sys

import torch

from dflash.bench import target_spec
from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.specs import DrafterSpec, build_drafter, load_target

torch.set_num_threads(2)
target = load_target(target_spec("smollm2_135m", "float32", "auto"))
target.new_cache()
drafter = build_drafter(DrafterSpec(path=sys.argv[1], dtype="auto"), target)
rows = [json.loads(line) for line in open(sys.argv[2])][:6]
tokenizer = target.tokenizer
proposers = {
    "module": DFlashProposer(drafter, target.embed, target.draft_logits),
    "lean": DFlashProposer(drafter, target.embed, target.draft_logits, target.draft_dtype),
}
stops = [tokenizer.eos_token_id]


def prompt_ids(row):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": row["turns"][0]}], add_generation_prompt=True, return_tensors="pt"
    )
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def run(name, ids):
    if name == "plain":
        return generate(target, ids, max_new_tokens=128, stop_token_ids=stops)
    return generate(target, ids, max_new_tokens=128, block_size=3, proposer=proposers[name], stop_token_ids=stops)


for name in ("plain", "module", "lean"):  # warm-up
    run(name, prompt_ids(rows[0]))
totals = {name: [0, 0.0, 0] for name in ("plain", "module", "lean")}
for round_ in range(2):
    for index, row in enumerate(rows):
        ids = prompt_ids(row)
        order = ["plain", "module", "lean"] if (index + round_) % 2 == 0 else ["lean", "module", "plain"]
        outputs = {}
        for name in order:
            result = run(name, ids)
            outputs[name] = result.output_ids
            totals[name][0] += len(result.output_ids)
            totals[name][1] += result.total_time_s
            totals[name][2] += result.num_steps
        assert outputs["module"] == outputs["plain"] == outputs["lean"]
for name, (tokens, seconds, steps) in totals.items():
    print(f"{name}: {tokens / seconds:.2f} tok/s, {1000 * seconds / steps:.1f} ms/step, tau {tokens / steps:.2f}")
plain = totals["plain"][0] / totals["plain"][1]
print(" ".join(f"speedup {name} {totals[name][0] / totals[name][1] / plain:.3f}" for name in ("module", "lean")))
