"""Forward costs that bound the speedup any drafter can give on this machine.

Times, for a tiny random target (median of repeats, after warm-up):
  - one target forward over 1 new token (an autoregressive step),
  - one target forward over B new tokens with feature taps (a DFlash verify step),
both with a KV cache already holding `--context` positions, and
  - one drafter block of B (1 and 5 drafter layers; `--context` positions of target
    features in the drafter's cache, one new context position per block, LM head included).

A DFlash step costs drafter + verify and emits at most B tokens, so the best possible
speedup is B * t_AR / (t_draft + t_verify), and the acceptance length tau needed just to
break even is (t_draft + t_verify) / t_AR.

    python scripts/bench_forward.py                  # tiny Qwen3, context 300, block 16, 1 thread
    python scripts/bench_forward.py --threads 2 --context 1000

One CPU thread by default: tiny models are overhead-bound, so more threads only add
synchronisation, and on a shared CPU they thrash (measured here: 15x slower and worse). The header
prints the load average so that noisy numbers can be recognised.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from dflash.decoding import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids
from dflash.target import TargetModel, crop_cache
from dflash.target.tiny import build_tiny_target


def interleaved_median_ms(steps: dict, repeats: int, warmup: int = 5) -> dict:
    """Median wall-clock milliseconds of each `steps[name]()`.

    The steps take turns within each repeat, so that load from other processes falls
    on all of them alike and their ratios stay meaningful on a busy machine.
    """
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(samples) for name, samples in times.items()}


def target_step(target: TargetModel, context: int, new_tokens: int, layer_ids):
    """A function running one target forward over `new_tokens` positions after a cache of `context` positions."""
    cache = target.new_cache()
    prompt = torch.randint(0, 256, (1, context))
    target.forward(prompt, torch.arange(context).unsqueeze(0), cache)
    ids = torch.randint(0, 256, (1, new_tokens))
    positions = torch.arange(context, context + new_tokens).unsqueeze(0)

    def step():
        target.forward(ids, positions, cache, layer_ids)
        crop_cache(cache, context)

    return step


def drafter_block(target: TargetModel, num_layers: int, num_taps: int, context: int, block_size: int):
    """A function drafting one block of `block_size` with `context` target positions already in the drafter's cache."""
    config = DrafterConfig.from_target(
        target.config, num_layers=num_layers, block_size=block_size, mask_token_id=target.tokenizer.mask_token_id,
        num_target_features=num_taps,
    )  # fmt: skip
    proposer = DFlashProposer(DFlashDrafter(config).eval(), target.embed, target.logits)
    feature_dim = num_taps * target.hidden_size
    committed = torch.randint(0, 256, (1, context + 2))
    proposer.propose(committed[:, : context + 1], torch.randn(1, context, feature_dim), block_size, block_size - 1)
    new_feature = torch.randn(1, 1, feature_dim)

    def block():
        proposer.cache.crop(context)
        proposer.propose(committed, new_feature, block_size, block_size - 1)

    return block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen3", choices=["qwen3", "llama"])
    parser.add_argument("--context", type=int, default=300, help="positions already in the KV caches")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = build_tiny_target(args.arch, seed=0)
    target = TargetModel(model, tokenizer)
    taps = default_target_layer_ids(target.num_layers, 3)
    b = args.block_size
    cfg = target.config
    threads = torch.get_num_threads()
    print(
        f"tiny {args.arch} target: {target.num_layers} layers, hidden {target.hidden_size}, vocab {cfg.vocab_size}; "
        f"KV cache of {args.context} positions; {threads} thread{'' if threads == 1 else 's'}; torch {torch.__version__}; "
        f"median of {args.repeats}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    with torch.inference_mode():
        steps = {
            "ar": target_step(target, args.context, 1, None),
            "verify": target_step(target, args.context, b, taps),
            **{layers: drafter_block(target, layers, len(taps), args.context, b) for layers in (1, 5)},
        }
        medians = interleaved_median_ms(steps, args.repeats)
    ar, verify = medians["ar"], medians["verify"]
    drafts = {layers: medians[layers] for layers in (1, 5)}
    rows = [
        ("target forward, 1 new token (autoregressive step)", ar, ""),
        (f"target forward, {b} new tokens + {len(taps)} taps (verify step)", verify, f"{verify / ar:.2f}x the 1-token step"),
    ]
    for layers, draft in drafts.items():
        step = draft + verify
        note = f"DFlash step {step:.3f} ms: break-even tau {step / ar:.2f}, best speedup {b * ar / step:.2f}x (tau = {b})"
        rows.append((f"drafter block of {b}, {layers} layer{'' if layers == 1 else 's'}", draft, note))
    width = max(len(name) for name, _, _ in rows)
    print(f"{'':<{width}}  {'median ms':>9}")
    for name, ms, note in rows:
        print(f"{name:<{width}}  {ms:9.3f}  {note}".rstrip())


if __name__ == "__main__":
    main()
