"""Build the tiny code target ahead of time and show what it does.

    python scripts/build_tiny_code.py                              # conf/target/tiny_code.yaml
    python scripts/build_tiny_code.py --out /tmp/tc --set max_steps=50 seq_len=256

Prints build_info.json, then a greedy continuation of a HumanEval prompt and the mean
top-1 probability of the greedy tokens (how confident, hence predictable, the model is).
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
    parser.add_argument("--new-tokens", type=int, default=256, help="greedy tokens for the confidence check")
    parser.add_argument("--prompt", type=int, default=0, help="index of the HumanEval prompt to continue")
    return parser.parse_args()


def main() -> int:
    from dflash.errors import ConfigError
    from dflash.target.tiny_code import TinyCodeConfig, build_tiny_code_target

    args = parse_args()
    with open(os.path.join(ROOT, "conf", "target", "tiny_code.yaml")) as handle:
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
    show_greedy_confidence(out_dir, args.prompt, args.new_tokens)
    return 0


def show_greedy_confidence(out_dir: str, prompt_index: int, new_tokens: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash.target.tiny_code_prompts import humaneval_prompts

    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    prompt = humaneval_prompts()[prompt_index]
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=tokenizer.pad_token_id,
        )
    top1 = torch.stack([scores.softmax(-1).max(-1).values[0] for scores in out.scores])
    text = tokenizer.decode(out.sequences[0, ids.shape[1] :])
    print(f"--- greedy continuation of HumanEval/{prompt_index} (first 200 chars) ---")
    print(text[:200])
    print(f"--- mean top-1 probability over {len(top1)} greedy tokens: {top1.mean():.3f} "
          f"(fraction >= 0.9: {(top1 >= 0.9).float().mean():.2f})")


if __name__ == "__main__":
    sys.exit(main())
