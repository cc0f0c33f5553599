"""Milliseconds per output token of the decode loop, for comparing two commits of it.

Decodes `--prompts` fixed prompts greedily with `dflash.decoding.generate` (autoregressive,
block 1, and the drafter's chain at its block size) and, unless `--tree-budget 0`, with
`dflash.decoding.tree.TreeVerifier`; `--repeats` times each, methods alternating within
each prompt. Prints, per method, the median over repeats of decode ms per token (decode
time, prefill excluded, over the tokens after the prefill's) and of total ms per token
(prefill included), with tau (pooled, bonus token counted). It uses only entry points
that exist before and after the loop's rewrite (issue 26), so the same script times both.

Models: `--target DIR --drafter DIR`; by default the SmolLM2 demo's (the newest
artifacts/runs/demo-smollm2-*/drafter, else artifacts/runs/smollm2/drafter, with
artifacts/targets/smollm2_135m) when present, else a tiny random Qwen3 target and a
random one-layer drafter (block 8).

Compare two commits on one otherwise idle machine (the loop under test is whichever
`dflash` PYTHONPATH points at; the script prints which), alternating runs so drift hits
both alike, and compare the medians of each side:

    git worktree add /tmp/dflash-old <old commit>          # e.g. main before the rewrite
    for i in 1 2 3; do
      for tree in /tmp/dflash-old "$PWD"; do
        PYTHONPATH=$tree python benchmarks/bench_loop.py --repeats 5 --device cuda
      done
    done
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess

import torch

import dflash
from dflash.decoding import TreeVerifier, generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, resolve_mask_token_id
from dflash.drafter.io import load_drafter
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n',
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h? Explain step by step.",
    "Explain in two sentences what a hash table is.",
    "Write a function that merges two sorted lists into one sorted list.",
    "List three uses of the Python standard library module itertools.",
    'def count_words(text):\n    """Count how often each word occurs in text."""\n',
    "What is 17 * 23? Show your working.",
]


def demo_paths(artifacts: str) -> tuple[str, str] | None:
    """(target dir, drafter dir) of the SmolLM2 demo, or None when it has not run here."""
    target = os.path.join(artifacts, "targets", "smollm2_135m")
    drafters = sorted(glob.glob(os.path.join(artifacts, "runs", "demo-smollm2-*", "drafter")), key=os.path.getmtime)
    drafters += [os.path.join(artifacts, "runs", "smollm2", "drafter")]
    found = [d for d in reversed(drafters) if os.path.isfile(os.path.join(d, "model.safetensors"))]
    return (target, found[0]) if found and os.path.isdir(target) else None


def load_models(args) -> tuple[TargetModel, DFlashDrafter, str]:
    paths = (args.target, args.drafter) if args.target else demo_paths(args.artifacts)
    if paths is None:
        target = TargetModel(*build_tiny_target("qwen3", seed=0))
        torch.manual_seed(0)
        mask_id = resolve_mask_token_id(target.tokenizer, target.embedding_rows)
        config = DrafterConfig.from_target(target.config, num_layers=1, block_size=8, mask_token_id=mask_id)
        target.model.to(args.device)
        return target, DFlashDrafter(config).to(args.device).eval(), "tiny random qwen3 + random drafter"
    target = TargetModel.load(paths[0], dtype=args.dtype, device=args.device)
    drafter = load_drafter(paths[1], device=args.device, dtype=target.dtype)
    return target, drafter, f"{paths[0]} + {paths[1]}"


def encode(target: TargetModel, prompt: str) -> torch.Tensor:
    """(1, P) ids: the chat template when the tokenizer has one, else the raw text."""
    tokenizer = target.tokenizer
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids


def commit_of(path: str) -> str:
    try:
        found = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return found.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target model directory (with --drafter; default: the demo's, else tiny random)")
    parser.add_argument("--drafter", help="drafter directory")
    parser.add_argument("--artifacts", default="artifacts", help="where the demo's models are looked for")
    parser.add_argument("--prompts", type=int, default=8, help=f"how many of the {len(PROMPTS)} fixed prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tree-budget", type=int, default=16, help="tree nodes per step; 0 skips tree verification")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", help="target dtype when loaded from a directory")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, drafter, label = load_models(args)
    block_size = drafter.config.block_size
    proposer = DFlashProposer(drafter, target.embed, target.logits)
    eos = target.tokenizer.eos_token_id
    common = dict(max_new_tokens=args.max_new_tokens, stop_token_ids=[eos] if eos is not None else [])
    methods = {
        "autoregressive": lambda ids: generate(target, ids, block_size=1, **common),
        f"chain B={block_size}": lambda ids: generate(target, ids, block_size=block_size, proposer=proposer, **common),
    }
    if args.tree_budget > 0:
        methods[f"tree N={args.tree_budget}"] = lambda ids: generate(
            target, ids, proposer=proposer, block_size=block_size, verifier=TreeVerifier(args.tree_budget), **common
        )
    prompts = [encode(target, text) for text in PROMPTS[: args.prompts]]
    for run in methods.values():  # warm-up: kernels, allocator, lazy inits
        run(prompts[0])

    decode_ms, total_ms, tau = ({name: [] for name in methods} for _ in range(3))
    for _ in range(args.repeats):
        totals = {name: [0.0, 0.0, 0, 0, 0] for name in methods}  # decode s, total s, tokens, steps, step tokens
        for ids in prompts:
            reference = None
            for name, run in methods.items():
                result = run(ids)
                reference = reference or result.output_ids
                if result.output_ids != reference:
                    raise SystemExit(f"{name} differs from autoregressive decoding: not lossless")
                entry = totals[name]
                entry[0] += result.decode_time_s
                entry[1] += result.prefill_time_s + result.decode_time_s
                entry[2] += len(result.output_ids)
                entry[3] += len(result.acceptance_lengths)
                entry[4] += sum(result.acceptance_lengths)
        for name, (decode_s, total_s, tokens, steps, step_tokens) in totals.items():
            decode_ms[name].append(1000 * decode_s / max(1, tokens - len(prompts)))
            total_ms[name].append(1000 * total_s / tokens)
            tau[name] = step_tokens / max(1, steps)

    package = os.path.dirname(os.path.dirname(os.path.abspath(dflash.__file__)))
    print(f"dflash from {package} (commit {commit_of(package)}); models: {label}; device {args.device}, "
          f"target {str(target.dtype).removeprefix('torch.')}; {len(prompts)} prompts x {args.max_new_tokens} new tokens, "
          f"greedy, {args.repeats} repeats, all outputs lossless")  # fmt: skip
    print(f"{'method':<16} {'decode ms/token':>16} {'total ms/token':>15} {'tau (pooled)':>13}")
    for name in methods:
        print(f"{name:<16} {statistics.median(decode_ms[name]):>16.3f} {statistics.median(total_ms[name]):>15.3f} "
              f"{tau[name]:>13.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
