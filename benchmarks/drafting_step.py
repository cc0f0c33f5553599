"""What a drafting step costs on SmolLM2-135M (float32 target, the fast engine), in one-token
steps of plain greedy decoding: DFlash, DSpark and EAGLE-3 with drafters that are never accepted
(tau 1, printed), so tokens/s over plain's is the inverse of a step's cost. DSpark's Markov head
and EAGLE-3's drafter run once through `lean_linears` (their linears on the engine's kernels, in
bfloat16: the default where the engine decodes on a CPU) and once as the modules (the path before
2026-11-29). One process, the paths in turns, best of 3; nothing else should run on the cores.

    python benchmarks/drafting_step.py 3     # the block size (EAGLE-3: a chain of B - 1 drafts)
"""

from __future__ import annotations

import sys
import time

import torch

from dflash.bench import target_spec
from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.dspark.proposer import DSparkProposer
from dflash.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Proposer
from dflash.specs import DrafterSpec, build_drafter, load_target

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a paperclip.",
    'def add(a, b):\n    """Return the sum of a and b."""\n',
]


def main(block: int, new_tokens: int = 64) -> None:
    torch.set_num_threads(2)
    target = load_target(target_spec("smollm2_135m", "float32", "auto", "cpu"))
    target.new_cache()  # tunes the kernels: untimed
    drafter = build_drafter(DrafterSpec(num_layers=3, block_size=block, init_from_target=True, seed=0), target).eval()
    drafter.add_dspark_heads(256, True)  # DeepSpec's rank
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.normal_(0, 0.01, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    eagle3 = Eagle3Drafter(Eagle3Config.from_target(target.config, draft_vocab_size=8192))  # experiment=eagle3_smollm2's
    lean = target.draft_dtype
    proposers = {
        "plain": lambda: None,
        "dflash": lambda: DFlashProposer.for_target(drafter, target),  # the same drafter without its heads
        "dspark lean": lambda: DSparkProposer(drafter, target.embed, target.draft_logits, lean),
        "dspark module": lambda: DSparkProposer(drafter, target.embed, target.draft_logits, lean_dtype=None),
        "eagle3 lean": lambda: Eagle3Proposer(eagle3, target.embed, lean),
        "eagle3 module": lambda: Eagle3Proposer(eagle3, target.embed),
    }
    prompts = [target.tokenizer(p, return_tensors="pt").input_ids for p in PROMPTS]
    accepted: list[int] = []

    def tokens_per_s(make) -> float:
        tokens, seconds = 0, 0.0
        for ids in prompts:
            proposer = make()
            width = 1 if proposer is None else block
            start = time.perf_counter()
            out = generate(target, ids, max_new_tokens=new_tokens, block_size=width, proposer=proposer)
            seconds += time.perf_counter() - start
            tokens += len(out.output_ids)
            accepted.extend(out.acceptance_lengths if proposer is not None else [])
        return tokens / seconds

    with torch.inference_mode():
        for make in proposers.values():
            tokens_per_s(make)  # warm-up
        best = dict.fromkeys(proposers, 0.0)
        for _ in range(3):
            for name, make in proposers.items():
                best[name] = max(best[name], tokens_per_s(make))
    print(f"B = {block}; tau {sum(accepted) / len(accepted):.3f} over {len(accepted)} drafting steps (1: never accepted)")
    for name, rate in best.items():
        print(f"  {name:<14} {rate:6.1f} tok/s   a step costs {best['plain'] / rate:.2f} one-token steps")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
