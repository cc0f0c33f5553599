"""Build the tiny code target ahead of time and show what it does.

    python scripts/build_tiny_code.py                              # dflash/conf/target/tiny_code.yaml
    python scripts/build_tiny_code.py --out /tmp/tc --set max_steps=50 seq_len=256

Prints build_info.json, then a greedy continuation of a HumanEval prompt and the mean
top-1 probability of the greedy tokens over a few prompts (how confident the model is).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="target directory (default: the config's path under ./artifacts)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override TinyCodeConfig fields")
    parser.add_argument("--prompts", type=int, default=8, help="HumanEval prompts for the confidence check")
    parser.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt at most")
    return parser.parse_args()


def main() -> int:
    from dflash.errors import ConfigError
    from dflash.toy.tiny_code import TinyCodeConfig, build_tiny_code_target

    args = parse_args()
    with open(os.path.join(ROOT, "dflash", "conf", "target", "tiny_code.yaml")) as handle:
        conf = yaml.safe_load(handle)
    build = dict(conf["build"])
    for item in args.set:
        key, _, value = item.partition("=")
        build[key] = yaml.safe_load(value)
    artifacts = os.environ.get("DFLASH_ARTIFACTS", os.path.join(ROOT, "artifacts"))
    out_dir = args.out or os.path.join(artifacts, "targets", "tiny_code")
    try:
        build_tiny_code_target(out_dir, TinyCodeConfig.from_dict(build))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with open(os.path.join(out_dir, "build_info.json")) as handle:
        print(json.dumps(json.load(handle), indent=2))
    show_greedy_confidence(out_dir, args.prompts, args.new_tokens)
    return 0


def show_greedy_confidence(out_dir: str, num_prompts: int, max_new_tokens: int) -> None:
    """Greedy-continue the first `num_prompts` HumanEval prompts (stopping at eos); print
    the first continuation and the mean top-1 probability of all greedy tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash.toy.tiny_code_prompts import humaneval_prompts

    torch.set_num_threads(1)  # a model this small runs fastest on one thread
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    top1 = []
    for index, prompt in enumerate(humaneval_prompts()[:num_prompts]):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            sequence = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )[0]
            # Raw next-token distributions at each generated position (no logits processors).
            probs = model(sequence[None]).logits[0, ids.shape[1] - 1 : -1].softmax(-1)
        top1.append(probs.max(-1).values)
        if index == 0:
            print("--- greedy continuation of HumanEval/0 (first 200 chars) ---")
            print(tokenizer.decode(sequence[ids.shape[1] :])[:200])
    top1 = torch.cat(top1)
    print(
        f"--- {len(top1)} greedy tokens over {num_prompts} HumanEval prompts: mean top-1 probability "
        f"{top1.mean():.3f}, median {top1.median():.3f}, fraction >= 0.9: {(top1 >= 0.9).float().mean():.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
