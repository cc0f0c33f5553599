"""`python -m dflash.sweep.prompts tiny_code`: the prompts the CPU sweeps regenerate.

Writes N function-header prompts cut from the Python standard library (none overlapping
HumanEval, see `dflash.target.tiny_code_prompts`) as JSONL rows `{"prompt": ...}`, for
`python -m dflash.regenerate` to answer with the tiny code target. Keeps an existing
file with the same count and seed, so the sweeps' prepare step is a no-op after the
first run.

    python -m dflash.sweep.prompts tiny_code --count 512
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dflash.errors import ConfigError
from dflash.fileio import write_text
from dflash.sweep.jobs import write_json_atomic


def default_path() -> str:
    artifacts = os.environ.get("DFLASH_ARTIFACTS", os.path.join(os.getcwd(), "artifacts"))
    return os.path.join(artifacts, "data", "tiny_code_prompts.jsonl")


def write_tiny_code_prompts(path: str, count: int, seed: int = 0) -> bool:
    """Write `count` stdlib prompts to `path` (JSONL); False when an identical file exists."""
    from dflash.target.tiny_code_prompts import stdlib_code_prompts

    stamp_path = path + ".meta.json"
    stamp = {"count": count, "seed": seed, "doctest_first": True}  # the recipe, so a changed one rewrites
    if os.path.isfile(path) and os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                return False
    prompts = stdlib_code_prompts(count, seed=seed, doctest_first=stamp["doctest_first"])
    write_text(path, "".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    write_json_atomic(stamp_path, stamp)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash.sweep.prompts", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["tiny_code"])
    parser.add_argument("--count", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default: $DFLASH_ARTIFACTS/data/tiny_code_prompts.jsonl")
    args = parser.parse_args(argv)
    path = args.out or default_path()
    try:
        wrote = write_tiny_code_prompts(path, args.count, args.seed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{'wrote' if wrote else 'kept'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
