"""Chain vs tree verification with one drafter: tau and tokens/s in one run.

For each prompt, in turn: autoregressive decoding (block 1), the chain (`engine.generate`
with the drafter's block size) and tree verification at each `--budgets` value, all
greedy, same proposer; every output must equal the autoregressive one (lossless).
Methods alternate within each prompt, so load from other processes falls on all alike;
compare the ratios, not the absolute rates, on a shared machine.

tau is pooled over all verify steps (accepted drafts + 1: the target's own token
counts); verified/step is the tokens one verify forward runs on (anchor + drafts or
tree nodes); tokens/s is new tokens over prefill + decode time, summed over prompts.

    python benchmarks/bench_tree.py --target DIR --drafter DIR --prompts 10   # HumanEval prompts
    python benchmarks/bench_tree.py                                           # tiny random target and drafter
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from dflash.decoding import TreeVerifier, generate
from dflash.dflash.adaptive import ThresholdProposer
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, resolve_mask_token_id
from dflash.drafter.io import load_drafter
from dflash.eval.benchmarks import BenchmarkSpec, humaneval_path, load_benchmark
from dflash.eval.prompts import PromptBuilder, stop_token_ids
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target


def load_models(args) -> tuple[TargetModel, DFlashDrafter]:
    if args.target is None:
        target = TargetModel(*build_tiny_target("qwen3", seed=0))
        torch.manual_seed(0)
        mask_id = resolve_mask_token_id(target.tokenizer, target.embedding_rows)
        config = DrafterConfig.from_target(target.config, num_layers=1, block_size=16, mask_token_id=mask_id)
        return target, DFlashDrafter(config).eval()
    target = TargetModel.load(args.target, dtype="float32")
    return target, load_drafter(args.drafter)


def count_verified_tokens(target: TargetModel) -> list[int]:
    """Patch `target.forward` to add the tokens of every verify forward (prefill, which
    keeps only the last logits, excluded) to the returned one-element counter."""
    counter, forward = [0], target.forward

    def counting_forward(input_ids, *args, **kwargs):
        if kwargs.get("logits_to_keep", 0) == 0:
            counter[0] += input_ids.shape[1]
        return forward(input_ids, *args, **kwargs)

    target.forward = counting_forward
    return counter


def prompt_ids(target: TargetModel, count: int) -> list[torch.Tensor]:
    samples = load_benchmark(BenchmarkSpec(name="humaneval", path=humaneval_path(), max_samples=count))
    builder = PromptBuilder(target.tokenizer)
    return [builder.encode(sample.turns[:1]) for sample in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target model directory (default: tiny random Qwen3)")
    parser.add_argument("--drafter", help="drafter directory (default: random one-layer drafter)")
    parser.add_argument("--prompts", type=int, default=10, help="HumanEval prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32])
    parser.add_argument(
        "--thresholds",
        type=float,
        nargs="*",
        default=[],
        help="draft_threshold values, each run on the chain and on the largest tree",
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, drafter = load_models(args)
    block_size = drafter.config.block_size
    verified_tokens = count_verified_tokens(target)
    proposer = DFlashProposer(drafter, target.embed, target.logits)
    stops = stop_token_ids(target.tokenizer, getattr(target.model, "generation_config", None))
    common = dict(max_new_tokens=args.max_new_tokens, stop_token_ids=stops)
    methods = {
        "autoregressive": lambda ids: generate(target, ids, block_size=1, **common),
        f"chain B={block_size}": lambda ids: generate(target, ids, block_size=block_size, proposer=proposer, **common),
    }
    for budget in args.budgets:
        methods[f"tree N={budget}"] = lambda ids, budget=budget: generate(
            target, ids, proposer=proposer, block_size=block_size, verifier=TreeVerifier(budget), **common
        )
    for threshold in args.thresholds:
        cut = ThresholdProposer(proposer, threshold)
        methods[f"chain t={threshold:g}"] = lambda ids, cut=cut: generate(
            target, ids, block_size=block_size, proposer=cut, **common
        )
        methods[f"tree N={max(args.budgets)} t={threshold:g}"] = lambda ids, threshold=threshold: generate(
            target,
            ids,
            proposer=proposer,
            block_size=block_size,
            verifier=TreeVerifier(max(args.budgets), threshold),
            **common,
        )

    totals = {name: {"tokens": 0, "seconds": 0.0, "lengths": [], "verified": 0} for name in methods}
    prompts = prompt_ids(target, args.prompts)
    methods[f"chain B={block_size}"](prompts[0])  # warm-up
    started = time.perf_counter()
    for ids in prompts:
        reference = None
        for name, run in methods.items():
            forwards_before = verified_tokens[0]
            result = run(ids)
            reference = reference or result.output_ids
            if result.output_ids != reference:
                raise SystemExit(f"{name} differs from autoregressive decoding: not lossless")
            totals[name]["tokens"] += len(result.output_ids)
            totals[name]["seconds"] += result.total_time_s
            totals[name]["lengths"] += result.acceptance_lengths
            totals[name]["verified"] += verified_tokens[0] - forwards_before

    print(
        f"{len(prompts)} HumanEval prompts, max_new_tokens {args.max_new_tokens}, greedy, all outputs lossless; "
        f"{time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}"
    )
    ar_rate = totals["autoregressive"]["tokens"] / totals["autoregressive"]["seconds"]
    chain_rate = totals[f"chain B={block_size}"]["tokens"] / totals[f"chain B={block_size}"]["seconds"]
    print(f"{'method':<18} {'tau (pooled)':>12} {'steps':>6} {'verified/step':>13} {'tokens/s':>9} {'vs AR':>6} {'vs chain':>8}")
    for name, total in totals.items():
        rate = total["tokens"] / total["seconds"]
        tau = sum(total["lengths"]) / len(total["lengths"])
        verified = total["verified"] / len(total["lengths"])
        print(
            f"{name:<18} {tau:>12.2f} {len(total['lengths']):>6} {verified:>13.1f} {rate:>9.1f} {rate / ar_rate:>6.2f} {rate / chain_rate:>8.2f}"
        )


if __name__ == "__main__":
    main()
