"""Prompt families that need no network (from installed packages or made here), for regeneration.

A data source whose path is `builtin:<family>` (dflash/conf/data/smollm2_prompts.yaml) yields
user prompts `{"messages": [{"role": "user", "content": ...}]}` of that family, in a
seeded order, so a source `limit` of N takes a random sample of N. The target answers
them (`python -m dflash.regenerate`), which makes the drafter's training data.

Families, each kept apart from every evaluation prompt and its near-duplicates
(docs/design.md invariant 27):
- code: function headers and docstrings cut from the Python standard library, none a
  near-duplicate of a HumanEval prompt (`dflash.toy.tiny_code_prompts`), asked for as
  requests in one of a few wordings, the HumanEval harness's among them.
- math: grade-school word problems made here from templates with seeded names, items and
  numbers (`dflash.data.generated_prompts`), asked in the math benchmarks' wording
  ("... put your final answer within \\boxed{}"); no text of GSM8K, MATH or AIME.
- chat: general requests (explain, compare, write, plan, summarise, ...) made here from
  templates and topic lists (`dflash.data.generated_prompts`); no text of MT-Bench or AlpacaEval.
The evaluation's math and chat prompts (`heldout_prompts`) come from held-out templates that
training prompts never use. No PyPI package ships permissively licensed math or instruction
prompts of a usable size (docs/design.md, "Measured figures"), hence the generated families.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Collection

from dflash.errors import ConfigError, require

PREFIX = "builtin:"
CODE_REQUESTS = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{text}\n```",
    "Complete the following Python function:\n```python\n{text}\n```",
    "Implement this Python function and explain briefly how it works:\n```python\n{text}\n```",
)
# The math wording of the public DFlash harness (math500, gsm8k, aime), shared with
# `dflash.eval.benchmarks` so training prompts and benchmarks ask alike.
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{{}}."
DEFAULT_GENERATED_PROMPTS = 1024
DEFAULT_CODE_PROMPTS = 2048  # without a limit: the doctest-bearing headers first, then a spread over modules


def code_prompts(limit: int | None, seed: int) -> list[str]:
    from dflash.toy.tiny_code_prompts import stdlib_code_prompts

    headers = stdlib_code_prompts(limit or DEFAULT_CODE_PROMPTS, seed=seed, max_chars=1024)
    rng = random.Random(seed)
    return [rng.choice(CODE_REQUESTS).format(text=header) for header in headers]  # ends "\n": HumanEval's `{text}\n```


def math_prompts(limit: int | None, seed: int, heldout: bool = False, exclude: Collection[str] = ()) -> list[str]:
    from dflash.data.generated_prompts import math_word_problems

    problems = math_word_problems(limit or DEFAULT_GENERATED_PROMPTS, seed, heldout, exclude)
    return [problem + MATH_SUFFIX.format() for problem in problems]


def chat_prompts(limit: int | None, seed: int, heldout: bool = False, exclude: Collection[str] = ()) -> list[str]:
    from dflash.data.generated_prompts import chat_requests

    return chat_requests(limit or DEFAULT_GENERATED_PROMPTS, seed, heldout, exclude)


FAMILIES = {"code": code_prompts, "math": math_prompts, "chat": chat_prompts}


def is_builtin(path: str) -> bool:
    return path.startswith(PREFIX)


def builtin_rows(path: str, limit: int | None, key: str, seed: int = 0) -> list[dict]:
    """Rows of the family that `path` ("builtin:<family>") names: at most `limit`, seeded order."""
    family = path[len(PREFIX) :]
    if family not in FAMILIES:
        raise ConfigError(
            f"{key}.path", f"unknown built-in prompt family {family!r}; choose one of {[PREFIX + f for f in FAMILIES]}"
        )
    require(limit is None or limit > 0, f"{key}.limit", f"must be positive or null, got {limit}")
    try:
        prompts = FAMILIES[family](limit, seed)
    except ValueError as err:  # fewer distinct prompts than asked for (a ConfigError of the stdlib cutter too)
        reason = str(err).removeprefix(f"{err.key}: ") if isinstance(err, ConfigError) else str(err)
        raise ConfigError(f"{key}.limit", f"{path}: {reason}") from None
    return [{"messages": [{"role": "user", "content": prompt}]} for prompt in prompts]


HELDOUT_SEED = 1_000_003  # the evaluation's draw; training sources use their own seed (0 by default)


def regenerated_prompts(data_dir: str) -> list[str]:
    """The user prompts of the regenerated rows in `data_dir` (its rows-*.jsonl shards)."""
    prompts = []
    for name in sorted(os.listdir(data_dir)):
        if name.startswith("rows-") and name.endswith(".jsonl"):
            with open(os.path.join(data_dir, name)) as f:
                for line in f:
                    messages = json.loads(line).get("messages") or []
                    prompts += [m["content"] for m in messages if m.get("role") == "user"]
    return prompts


def heldout_prompts(family: str, count: int, training: list[str]) -> list[str]:
    """`count` evaluation prompts of a generated family (math or chat): from its held-out
    templates, which the training prompts never use, drawn with HELDOUT_SEED, and none a
    near-duplicate (same skeleton) of a prompt in `training`, whatever made those.
    ConfigError (key `<family>`, the count's; the caller adds its group) when the family
    has too few prompts left."""
    from dflash.data.generated_prompts import skeleton

    require(family in ("math", "chat"), "family", f"held-out prompts are generated for math and chat, not {family!r}")
    seen = {skeleton(prompt.removesuffix(MATH_SUFFIX.format())) for prompt in training}
    try:
        return FAMILIES[family](count, HELDOUT_SEED, heldout=True, exclude=seen)
    except ValueError as err:
        raise ConfigError(family, f"cannot draw {count} held-out {family} prompts: {err}; ask for fewer") from None
