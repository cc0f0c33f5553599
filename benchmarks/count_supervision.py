"""Supervised positions per training sequence for pairs of (training B, anchors), on real
data (prints numbers; not a test).

A block supervises its slots 1..B-1 that fall on response tokens inside the sequence, and
a sequence with fewer valid anchors than asked for gets all of them (`dflash.training.
anchors`), so "B - 1 positions per anchor" overstates what short responses train on. This
counts it over one epoch of the training split, with the same tokenisation, split,
anchor sampling and block layout as training; use it to pick anchor counts that give two
block sizes the same supervision (dflash/conf/sweep/block_size_controlled_cpu.yaml).

    python benchmarks/count_supervision.py 16:64 8:137 8:164       # the CPU sweeps' data
    python benchmarks/count_supervision.py 16:512 8:1024 --data artifacts/data/qwen3_8b \\
        --tokenizer Qwen/Qwen3-8B --max-length 3072 --val-fraction 0.01
"""

from __future__ import annotations

import argparse
import os

import torch


def count(
    data: str,
    tokenizer: str,
    max_length: int,
    val_fraction: float,
    pairs: list[tuple[int, int]],
    sampling: str = "random",
    seed: int = 0,
) -> dict[tuple[int, int], float]:
    """Mean supervised positions per training sequence for each (B, anchors) pair."""
    from transformers import AutoTokenizer

    from dflash.data.config import DataSpec
    from dflash.data.datamodule import DFlashDataModule
    from dflash.training.anchors import sample_anchors
    from dflash.training.blocks import build_blocks

    spec = DataSpec(path=data, max_length=max_length, batch_size=16, val_fraction=val_fraction)
    datamodule = DFlashDataModule.from_spec(spec, AutoTokenizer.from_pretrained(tokenizer))
    datamodule.prepare_data()
    datamodule.setup("fit")
    torch.manual_seed(seed)  # the loader's shuffle: the same batches, so the same counts, every run
    batches = list(datamodule.train_dataloader())
    sequences = sum(batch["input_ids"].shape[0] for batch in batches)
    counts = {}
    for block_size, num_anchors in pairs:
        generator = torch.Generator().manual_seed(seed)
        supervised = 0
        for batch in batches:
            anchors = sample_anchors(batch["loss_mask"], block_size, num_anchors, sampling, generator)
            blocks = build_blocks(batch["input_ids"], batch["loss_mask"], anchors, block_size, mask_token_id=0)
            supervised += int(blocks.label_valid.sum())
        counts[(block_size, num_anchors)] = supervised / sequences
    print(f"{sequences} training sequences")
    return counts


def main() -> None:
    artifacts = os.environ.get("DFLASH_ARTIFACTS", "artifacts")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="+", help="B:anchors, e.g. 16:64")
    parser.add_argument("--data", default=os.path.join(artifacts, "data", "tiny_code"))
    parser.add_argument("--tokenizer", default=os.path.join(artifacts, "targets", "tiny_code"))
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--val-fraction", type=float, default=0.0625)
    parser.add_argument("--sampling", default="random", choices=["random", "stride"])
    args = parser.parse_args()
    pairs = []
    for pair in args.pairs:
        block_size, _, num_anchors = pair.partition(":")
        if not (block_size.isdigit() and num_anchors.isdigit()):
            parser.error(f"{pair!r} is not B:anchors (e.g. 16:64)")
        pairs.append((int(block_size), int(num_anchors)))
    for flag, path in (("--data", args.data), ("--tokenizer", args.tokenizer)):
        # a local directory, or (the tokenizer) a hub id such as Qwen/Qwen3-8B
        if not os.path.isdir(path) and (flag == "--data" or os.path.isabs(path) or path.startswith(".")):
            parser.error(f"{flag} {path}: no such directory (build it first, e.g. `make demo`, or set DFLASH_ARTIFACTS)")
    for (block_size, num_anchors), value in count(
        args.data, args.tokenizer, args.max_length, args.val_fraction, pairs, args.sampling
    ).items():
        print(
            f"B = {block_size:>3}, {num_anchors:>4} anchors: {value:7.1f} supervised positions per sequence "
            f"({value / num_anchors:.2f} per anchor asked for)"
        )


if __name__ == "__main__":
    main()
