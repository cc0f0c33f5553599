"""`python -m dflash.sweep.prompts KIND`: prompt files the sweeps' prepare steps write.

- `tiny_code`: N function-header prompts cut from the Python standard library (none
  a near-duplicate of a HumanEval prompt, see `dflash.toy.tiny_code_prompts`) as JSONL rows
  `{"prompt": ...}`, for `python -m dflash.regenerate` to answer with the tiny code target.
- `smollm2_eval`: the evaluation prompts of the smollm2 sweeps, one mixed benchmark file
  of three families (rows `{"turns": [text], "family": ...}`): N HumanEval problems in the
  public harness's wording (a seeded subset), then N held-out math and N held-out chat
  prompts, none a near-duplicate of a prompt of the training data (`--data`; docs/design.md
  invariant 27).

Each keeps an existing file made with the same settings, so a prepare step is a no-op
after the first run.

    python -m dflash.sweep.prompts tiny_code --count 512
    python -m dflash.sweep.prompts smollm2_eval --count 6 --data artifacts/data/smollm2_135m-prompts --out mix.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

from dflash.errors import ConfigError, require
from dflash.fileio import read_json, write_json, write_jsonl
from dflash.layout import artifacts_root


def expand(path: str) -> str:
    """`path` with `${paths.artifacts}` (as a sweep's prepare step writes it) replaced by the artifacts root."""
    return path.replace("${paths.artifacts}", artifacts_root())


def write_tiny_code_prompts(path: str, count: int, seed: int = 0) -> bool:
    """Write `count` stdlib prompts to `path` (JSONL); False when an identical file exists."""
    from dflash.toy.tiny_code_prompts import stdlib_code_prompts

    stamp = {"count": count, "seed": seed, "doctest_first": True, "humaneval": "near-duplicates out"}  # the recipe
    if _unchanged(path, stamp):
        return False
    prompts = stdlib_code_prompts(count, seed=seed, doctest_first=stamp["doctest_first"])
    write_jsonl(path, ({"prompt": prompt} for prompt in prompts))
    write_json(path + ".meta.json", stamp, indent=2)
    return True


EVAL_FAMILIES = ("humaneval", "math", "chat")


def write_mixed_eval_prompts(path: str, data_dir: str, count: int, seed: int = 0) -> bool:
    """Write `count` prompts of each family of EVAL_FAMILIES to `path`; False when a file
    made with the same settings and training prompts exists."""
    from dflash.data.builtin_prompts import heldout_prompts, regenerated_prompts
    from dflash.eval.benchmarks import BenchmarkSpec, load_benchmark

    require(count >= 1, "--count", f"must be >= 1, got {count}")
    require(os.path.isdir(data_dir), "--data", f"{data_dir!r} is not a directory of regenerated rows; regenerate first")
    training = regenerated_prompts(data_dir)
    require(training, "--data", f"{data_dir!r} has no regenerated rows (rows-*.jsonl); regenerate first")
    stamp = {"count": count, "seed": seed, "families": list(EVAL_FAMILIES), "training_prompts": _digest(training)}
    stamp["heldout"] = "templates"  # held-out templates since design.md invariant 27: older files are written again
    if _unchanged(path, stamp):
        return False
    code = load_benchmark(BenchmarkSpec(name="humaneval", prompt_format="paper", max_samples=count, seed=seed))
    rows = [{"turns": sample.turns, "family": "humaneval"} for sample in code]
    for family in EVAL_FAMILIES[1:]:
        rows += [{"turns": [prompt], "family": family} for prompt in heldout_prompts(family, count, training)]
    write_jsonl(path, rows)
    write_json(path + ".meta.json", stamp, indent=2)
    return True


def _unchanged(path: str, stamp: dict) -> bool:
    return os.path.isfile(path) and read_json(path + ".meta.json") == stamp


def _digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash.sweep.prompts", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["tiny_code", "smollm2_eval"])
    parser.add_argument("--count", type=int, default=512, help="tiny_code: prompts; smollm2_eval: prompts per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="smollm2_eval: the regenerated training data (its prompts are held out)")
    parser.add_argument("--out", default=None, help="tiny_code default: $DFLASH_ARTIFACTS/data/tiny_code_prompts.jsonl")
    args = parser.parse_args(argv)
    try:
        if args.kind == "tiny_code":
            path = args.out or os.path.join(artifacts_root(), "data", "tiny_code_prompts.jsonl")
            wrote = write_tiny_code_prompts(path, args.count, args.seed)
        else:
            require(args.data is not None and args.out is not None, "--data", "smollm2_eval needs --data DIR and --out FILE")
            path = expand(args.out)
            wrote = write_mixed_eval_prompts(path, expand(args.data), args.count, args.seed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{'wrote' if wrote else 'kept'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
