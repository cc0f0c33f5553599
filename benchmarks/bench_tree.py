"""Chain against tree verification, each alone and behind prompt lookup, with one trained
drafter on SmolLM2-135M-Instruct: tau, time per step and the speed-up over plain decoding.

    python benchmarks/bench_tree.py DRAFTER_DIR PROMPTS.jsonl --family chat --cases tree6,lookup,lookup+tree6,lookup7+tree6

PROMPTS.jsonl: rows with `turns` (the first is the user turn, in the chat template) and
optionally `family` (`--family` keeps one; `python -m dflash.sweep.prompts smollm2_eval` writes
such a file). Cases beside plain decoding (B = 1) and the chain (`dflash`): `treeN` (a tree of
N nodes, `dflash_tree.budget`), `lookup` (`dflash_lookup`), `lookup+treeN` (`dflash_tree`
with `lookup_ngram`); `lookupK` lets a lookup step draft up to K tokens (`dflash_lookup.tokens`,
`dflash_tree.lookup_tokens`), e.g. `lookup7+tree6`. Per prompt every case runs once, the case
order rotating from prompt to prompt, so a machine's drift falls on all alike; every output must
equal plain decoding's (float32: lossless). The drafter proposes as evaluation does (`DFlashProposer.for_target`);
the target runs on the fast engine, greedy, 2 threads.
"""

from __future__ import annotations

import argparse
import json

import torch

from dflash.bench import target_spec
from dflash.decoding import ChainVerifier, TreeVerifier, generate
from dflash.decoding.ngram import LookupFirst
from dflash.dflash.proposer import DFlashProposer
from dflash.specs import DrafterSpec, build_drafter, load_target


def cases(names: list[str], proposer, block_size: int, ngram: int) -> dict:
    """name -> (verify width, proposer, verifier); plain decoding and the chain first."""
    made = {"plain": (1, None, ChainVerifier()), "chain": (block_size, proposer, ChainVerifier())}
    for name in names:
        lookup, _, tree = name.partition("+") if name.startswith("lookup") else ("", "", name)
        tokens = lookup.removeprefix("lookup")
        if (lookup and tokens and not tokens.isdigit()) or (tree and not (tree.startswith("tree") and tree[4:].isdigit())):
            raise SystemExit(f"--cases: unknown case {name!r}; cases: treeN, lookup[K], lookup[K]+treeN")
        width = max(block_size, int(tokens) + 1) if tokens else block_size
        drafting = LookupFirst(proposer, ngram, block_size) if lookup else proposer
        made[name] = (width, drafting, TreeVerifier(int(tree[4:])) if tree else ChainVerifier())
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter", help="a DFlash drafter directory")
    parser.add_argument("prompts", help="a .jsonl of prompts (module docstring)")
    parser.add_argument("--family", help="keep the rows of this family")
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cases", default="tree6,lookup,lookup+tree6")
    parser.add_argument("--ngram", type=int, default=3, help="the lookup's n (dflash_lookup.ngram)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()

    torch.set_num_threads(2)
    target = load_target(target_spec("smollm2_135m", args.dtype, "auto"))
    target.new_cache()  # tunes the kernels
    drafter = build_drafter(DrafterSpec(path=args.drafter, dtype="auto"), target)
    proposer = DFlashProposer.for_target(drafter, target)
    with open(args.prompts) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    texts = [row["turns"][0] for row in rows if args.family in (None, row.get("family"))][: args.count]
    prompts = [
        target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
        for text in texts
    ]
    prompts = [ids if isinstance(ids, torch.Tensor) else ids["input_ids"] for ids in prompts]
    stops = [target.tokenizer.eos_token_id]
    runs = cases(args.cases.split(","), proposer, drafter.config.block_size, args.ngram)

    def run(name, ids, new_tokens=args.new_tokens):
        block_size, drafting, verifier = runs[name]
        return generate(
            target,
            ids,
            max_new_tokens=new_tokens,
            block_size=block_size,
            proposer=drafting,
            verifier=verifier,
            stop_token_ids=stops,
        )

    names = list(runs)
    for name in names:  # warm-up
        run(name, prompts[0], 16)
    totals = {name: [0, 0.0, 0] for name in names}  # tokens, seconds, steps
    turn = 0
    for _ in range(args.rounds):
        for index, ids in enumerate(prompts):
            outputs = {}
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                result = run(name, ids)
                outputs[name] = result.output_ids
                totals[name][0] += len(result.output_ids)
                totals[name][1] += result.total_time_s
                totals[name][2] += result.num_steps
            turn += 1
            if args.dtype == "float32" and any(output != outputs["plain"] for output in outputs.values()):
                raise SystemExit(f"prompt {index}: a case's output is not plain decoding's")
    plain = totals["plain"][0] / totals["plain"][1]
    print(f"{args.family or 'all'} ({len(prompts)} prompts x {args.rounds}), {args.dtype}:")
    for name, (tokens, seconds, steps) in totals.items():
        print(f"  {name:<14} tau {tokens / steps:.3f}  {1000 * seconds / steps:6.2f} ms/step  {tokens / seconds / plain:.3f}x")


if __name__ == "__main__":
    main()
