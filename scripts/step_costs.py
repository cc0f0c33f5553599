"""The cost of one speculative decoding step against one autoregressive step, per block size,
on the machine at hand: the break-even tau of each block size.

    python scripts/step_costs.py --target artifacts/targets/smollm2_135m DRAFTER_DIR ... [--threads 2]

For each drafter (its block size B): the median time of the target's verify forward over
B tokens with the drafter's taps (after a 256-token prompt in the cache), of the drafter's
propose (B - 1 draft logits), and of a one-token forward (the autoregressive step). A DFlash
step costs propose + verify; tau must exceed that cost in autoregressive steps to gain.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dflash.decoding.proposer import DFlashProposer
from dflash.drafter.io import load_drafter
from dflash.specs import TargetSpec, load_target
from dflash.target import crop_cache

PROMPT = 256


def median_ms(fn, repeats: int = 15) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+")
    parser.add_argument("--target", required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(TargetSpec(path=args.target, dtype="float32"))
    ids = torch.randint(100, 20_000, (1, PROMPT + 16), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = target.new_cache()
        target.forward(ids[:, :PROMPT], torch.arange(PROMPT).unsqueeze(0), cache, logits_to_keep=1)

        def forward(n: int, taps):
            target.forward(ids[:, PROMPT : PROMPT + n], torch.arange(PROMPT, PROMPT + n).unsqueeze(0), cache, taps)
            crop_cache(cache, PROMPT)

        one = median_ms(lambda: forward(1, None))
        print(f"autoregressive step (1-token forward): {one:.1f} ms, {args.threads} threads")
        print(f"{'B':>3}{'verify ms':>11}{'propose ms':>12}{'step ms':>9}{'break-even tau':>16}")
        for path in args.drafters:
            drafter = load_drafter(path)
            block, taps = drafter.config.block_size, list(drafter.config.target_layer_ids)
            features = target.forward(
                ids[:, :PROMPT], torch.arange(PROMPT).unsqueeze(0), target.new_cache(), taps, logits_to_keep=1
            ).features
            proposer = DFlashProposer(drafter, target.embed, target.logits)
            committed = ids[:, : PROMPT + 1]
            proposer.propose(committed, features, block, block - 1)

            def propose(proposer=proposer, committed=committed, features=features, block=block):
                proposer.cache.crop(PROMPT)
                proposer.propose(committed, features[:, :0], block, block - 1)

            verify = median_ms(lambda block=block, taps=taps: forward(block, taps))
            draft = median_ms(propose)
            print(f"{block:>3}{verify:>11.1f}{draft:>12.1f}{verify + draft:>9.1f}{(verify + draft) / one:>16.2f}   {path}")


if __name__ == "__main__":
    main()
