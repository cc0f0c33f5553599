"""How many of the target's own answers to the demo's held-out prompts a drafter can draft at
all: the share of answer tokens inside its draft vocabulary (draft_vocab.json), per family.

    python benchmarks/draft_vocab_coverage.py RUN_DIR HELDOUT_DIR

RUN_DIR: a demo run (artifacts/runs/demo-smollm2-*), HELDOUT_DIR: its held-out prompts
(artifacts/demo/smollm2-data-*-demo). Greedy answers of 128 tokens, float32, HF generate.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(2)
run_dir, heldout_dir = sys.argv[1:3]
path = "artifacts/targets/smollm2_135m"
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
with open(f"{run_dir}/drafter/draft_vocab.json") as f:
    vocab = set(json.load(f)["token_ids"])
for family in ("chat", "math"):
    inside = total = 0
    outside = []
    with open(f"{heldout_dir}/heldout_{family}.jsonl") as f:
        for line in f:
            messages = [{"role": "user", "content": json.loads(line)["turns"][0]}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            answer = model.generate(**ids, max_new_tokens=128, do_sample=False)[0, ids["input_ids"].shape[1] :].tolist()
            total += len(answer)
            inside += sum(token in vocab for token in answer)
            outside += [tokenizer.decode([token]) for token in answer if token not in vocab]
    print(
        f"{family}: {inside} of {total} answer tokens inside the draft vocabulary ({inside / total:.1%}); outside, e.g. {outside[:12]}"
    )
