"""DFlash decoding of SmolLM2-135M-Instruct with a trained drafter against plain decoding, in one
process: per propose path, tokens/s (prefill included), time per step, tau and the speed-up over
plain decoding, every output checked to be plain decoding's; with --breakdown, where a step's
time goes instead.

    python benchmarks/dflash_decode_loop.py DRAFTER_DIR PROMPTS [--count 6] [--paths module,lean,vocab]
    python benchmarks/dflash_decode_loop.py DRAFTER_DIR humaneval --count 4 --breakdown

PROMPTS: a held-out file of `make demo` (`heldout_chat.jsonl`, `heldout_math.jsonl`: its first
--count prompts) or `humaneval` (its last --count problems), each as a user turn of the chat
template. The target runs in float32 on the fast engine, 2 threads; block 3, 128 new tokens,
2 rounds, the paths in alternating order per prompt. The paths: `module` proposes through the
drafter's PyTorch module, `lean` through its bfloat16 lean forward (`dflash.engine.FastDrafter`)
over the whole vocabulary, `vocab` the same over its draft vocabulary (draft_vocab.json; the
default paths include it where the drafter has one).

--breakdown splits a step of plain decoding (B = 1) and of DFlash (the last path) into the
target's forwards (the prefill's taken out), the propose, acceptance, the cache's compaction
and the rest, twice, then prints torch.profiler's table of one DFlash request.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import time

import torch
from torch.profiler import profile, record_function

from dflash.bench import target_spec
from dflash.decoding import ChainVerifier, generate
from dflash.dflash.proposer import DFlashProposer
from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, humaneval_path
from dflash.specs import DrafterSpec, build_drafter, load_target


def prompt_texts(source: str, count: int) -> list[str]:
    if source == "humaneval":
        with gzip.open(humaneval_path(), "rt") as f:
            return [HUMANEVAL_TEMPLATE.format(text=json.loads(line)["prompt"]) for line in f][-count:]
    with open(source) as f:
        return [json.loads(line)["turns"][0] for line in f][:count]


def chat_ids(tokenizer, text: str) -> torch.Tensor:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def proposers(target, drafter, paths: list[str]) -> dict[str, DFlashProposer]:
    made = {}
    for path in paths:
        if path == "module":
            made[path] = DFlashProposer(drafter, target.embed, target.draft_logits)
        elif path == "lean":
            made[path] = DFlashProposer(drafter, target.embed, target.draft_logits, target.draft_dtype)
        elif path == "vocab" and drafter.draft_vocab is not None:
            made[path] = DFlashProposer(drafter, target.embed, target.draft_logits_over(drafter.draft_vocab), target.draft_dtype)
        elif path == "vocab":
            raise SystemExit("--paths vocab: the drafter directory has no draft_vocab.json")
        else:
            raise SystemExit(f"--paths: unknown path {path!r}; the paths are module, lean, vocab")
    return made


def compare(decode, by_name: dict[str, DFlashProposer | None], prompts: list[torch.Tensor], rounds: int) -> None:
    names = list(by_name)
    for name in names:  # warm-up
        decode(prompts[0], by_name[name])
    totals = {name: [0, 0.0, 0] for name in names}  # tokens, seconds, steps
    for round_ in range(rounds):
        for index, ids in enumerate(prompts):
            outputs = {}
            for name in names if (index + round_) % 2 == 0 else names[::-1]:
                result = decode(ids, by_name[name])
                outputs[name] = result.output_ids
                totals[name][0] += len(result.output_ids)
                totals[name][1] += result.total_time_s
                totals[name][2] += result.num_steps
            assert all(output == outputs["plain"] for output in outputs.values()), f"prompt {index}: not plain decoding's output"
    for name, (tokens, seconds, steps) in totals.items():
        print(f"{name}: {tokens / seconds:.2f} tok/s, {1000 * seconds / steps:.1f} ms/step, tau {tokens / steps:.3f}")
    plain = totals["plain"][0] / totals["plain"][1]
    print(" ".join(f"speedup {name} {totals[name][0] / totals[name][1] / plain:.3f}" for name in names[1:]))


def breakdown(target, decode, proposer: DFlashProposer, prompts: list[torch.Tensor], rounds: int) -> None:
    seconds: dict[str, float] = collections.defaultdict(float)
    verifier = ChainVerifier()

    def timed(owner, method: str, part: str) -> None:
        inner = getattr(owner, method)

        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            with record_function(part):
                result = inner(*args, **kwargs)
            seconds[part] += time.perf_counter() - start
            return result

        setattr(owner, method, wrapped)

    for owner, method, part in ((target, "forward", "target"), (proposer, "draft", "propose")):
        timed(owner, method, part)
    for method in ("accept", "compact"):
        timed(verifier, method, method)
    for drafting in (None, proposer):  # warm-up
        decode(prompts[0], drafting, verifier)
    for drafting in (None, proposer) * rounds:
        seconds.clear()
        steps = tokens = 0
        decoding = prefill = 0.0
        for ids in prompts:
            result = decode(ids, drafting, verifier)
            steps += result.num_steps
            tokens += len(result.output_ids)
            decoding += result.decode_time_s
            prefill += result.prefill_time_s
        parts = {part: 1000 * s / steps for part, s in seconds.items()}
        parts["target"] -= 1000 * prefill / steps  # the prefill's forward is not a step's
        other = 1000 * decoding / steps - sum(parts.values())
        cells = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
        print(
            f"{'plain' if drafting is None else 'dflash'}: tau {tokens / steps:.2f}, {1000 * decoding / steps:.1f} ms/step: {cells}, other {other:.2f}; "
            f"prefill {1000 * prefill / len(prompts):.0f} ms/prompt; {tokens / (decoding + prefill):.1f} tok/s"
        )
    with profile() as profiled:
        decode(prompts[-1], proposer, verifier)
    print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter", help="a drafter directory (make demo's: artifacts/runs/demo-smollm2-*/drafter)")
    parser.add_argument("prompts", help="a held-out .jsonl of make demo, or humaneval")
    parser.add_argument("--count", type=int, default=6, help="prompts (default 6)")
    parser.add_argument("--paths", help="comma-separated propose paths: module, lean, vocab (default all the drafter has)")
    parser.add_argument("--block-size", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--breakdown", action="store_true", help="where a step's time goes, for the last path")
    args = parser.parse_args()

    torch.set_num_threads(2)
    target = load_target(target_spec("smollm2_135m", "float32", "auto"))
    target.new_cache()
    drafter = build_drafter(DrafterSpec(path=args.drafter, dtype="auto"), target)
    paths = args.paths.split(",") if args.paths else ["module", "lean"] + ["vocab"] * (drafter.draft_vocab is not None)
    by_path = proposers(target, drafter, paths)
    prompts = [chat_ids(target.tokenizer, text) for text in prompt_texts(args.prompts, args.count)]
    stops = [target.tokenizer.eos_token_id]

    def decode(ids, proposer=None, verifier=None):
        width = 1 if proposer is None else args.block_size
        return generate(
            target,
            ids,
            max_new_tokens=args.new_tokens,
            block_size=width,
            proposer=proposer,
            verifier=verifier,
            stop_token_ids=stops,
        )

    if args.breakdown:
        breakdown(target, decode, by_path[paths[-1]], prompts, args.rounds)
    else:
        compare(decode, {"plain": None, **by_path}, prompts, args.rounds)


if __name__ == "__main__":
    main()
