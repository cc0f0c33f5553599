"""docs/design.md invariant 27: no evaluation prompt, nor a near-duplicate of one, is a
training prompt. Each check is also shown catching a near-duplicate seeded into the mix."""

from __future__ import annotations

import random
import re

import pytest

from dflash.data import generated_prompts
from dflash.data.builtin_prompts import (
    CODE_REQUESTS,
    DEFAULT_GENERATED_PROMPTS,
    FAMILIES,
    MATH_SUFFIX,
    heldout_prompts,
)
from dflash.data.generated_prompts import skeleton
from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, BenchmarkSpec, load_benchmark
from dflash.toy import tiny_code_prompts
from dflash.toy.tiny_code_prompts import humaneval_prompts, near_duplicate_test, near_humaneval, stdlib_code_prompts

MAKERS = {"math": generated_prompts._math_templates, "chat": generated_prompts._chat_templates}
HELDOUT = {"math": 256, "chat": 150}  # more than the demo, the sweeps or serve_check ask for; all of chat's


def every_template(family: str, draws: int = 40) -> list[list[str]]:
    """`draws` fillings of every template of `family`: one list per template id."""
    fillings = [MAKERS[family](random.Random(seed)) for seed in range(draws)]
    return [list(texts) for texts in zip(*fillings)]


def assert_templated_apart(training: list[str], evaluation: list[str]) -> None:
    templates = {skeleton(p.removesuffix(MATH_SUFFIX.format())) for p in training}
    shared = [p for p in evaluation if skeleton(p.removesuffix(MATH_SUFFIX.format())) in templates]
    assert not shared, f"{len(shared)} evaluation prompts share a template with a training prompt: {shared[:2]}"


def assert_code_apart(training: list[str], evaluation: list[str]) -> None:
    test = near_duplicate_test(evaluation)
    shared = [p for p in training if test(p)]
    assert not shared, f"{len(shared)} training prompts are near-duplicates of evaluation prompts: {shared[:2]}"


def disguised(text: str) -> str:
    """A near-duplicate of a generated prompt: other fillers, every number plus one."""
    lists = (generated_prompts.NAMES, generated_prompts.TOPICS, generated_prompts.AUDIENCES, generated_prompts.ACTIVITIES)
    swap = {word: words[(i + 1) % len(words)] for words in lists for i, word in enumerate(words)}
    fillers = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, swap), key=len, reverse=True)) + r")\b")
    return re.sub(r"\d+", lambda m: str(int(m.group()) + 1), fillers.sub(lambda m: swap[m.group()], text))


@pytest.mark.parametrize("family", ["math", "chat"])
def test_a_skeleton_names_its_template(family):
    skeletons = [{skeleton(text) for text in texts} for texts in every_template(family)]
    assert all(len(s) == 1 for s in skeletons)  # fillers and numbers abstracted out
    assert len(set.union(*skeletons)) == len(skeletons)  # no two templates alike


@pytest.mark.parametrize("family", ["math", "chat"])
def test_no_evaluation_prompt_shares_a_template_with_a_training_prompt(family):
    training = FAMILIES[family](DEFAULT_GENERATED_PROMPTS, 0) + FAMILIES[family](DEFAULT_GENERATED_PROMPTS, 1)
    evaluation = heldout_prompts(family, HELDOUT[family], [])  # serve_check's draw: no training data at hand
    assert len(set(evaluation)) == HELDOUT[family] and evaluation == heldout_prompts(family, HELDOUT[family], training)
    assert_templated_apart(training, evaluation)
    # every template is on one side: held out for evaluation (a quarter of them) or used by training
    kinds = lambda prompts: {skeleton(p.removesuffix(MATH_SUFFIX.format())) for p in prompts}  # noqa: E731
    templates = every_template(family)
    assert kinds(training) | kinds(evaluation) == kinds(t[0] for t in templates)
    assert len(templates) / 4 <= len(kinds(evaluation)) <= len(templates) / 3
    # the check catches a mix that ignores the split
    with pytest.raises(AssertionError, match="share a template"):
        assert_templated_apart([text for texts in templates for text in texts], evaluation)


@pytest.mark.parametrize("family", ["math", "chat"])
def test_a_seeded_near_duplicate_is_caught_and_its_template_left_out(family):
    evaluation = heldout_prompts(family, 8, [])
    near = disguised(evaluation[0])
    assert near != evaluation[0] and skeleton(near) == skeleton(evaluation[0])
    training = FAMILIES[family](64, 0)
    with pytest.raises(AssertionError, match="share a template"):
        assert_templated_apart([*training, near], evaluation)
    # training data that holds it (made before the split, or by other means): its template is left out
    again = heldout_prompts(family, 8, [*training, near])
    assert_templated_apart([*training, near], again)


def test_code_training_prompts_are_humaneval_shaped_and_no_near_duplicate_of_one():
    prompts = FAMILIES["code"](None, 0)  # the default 2,048
    headers = [re.search(r"```python\n(.*)\n```$", p, re.S).group(1) for p in prompts]
    assert_code_apart(headers, humaneval_prompts())
    # HumanEval's shape: a signature and a docstring, in one of the wordings, the harness's
    # among them and closed exactly as the harness closes HumanEval's prompts
    assert CODE_REQUESTS[0] == HUMANEVAL_TEMPLATE
    assert all(any(p == r.format(text=h) for r in CODE_REQUESTS) for p, h in zip(prompts, headers))
    assert all(re.match(r"(async )?def \w+ ?\(", h) and re.search(r"\n\s+[rbuRBU]*[\"']", h) for h in headers)
    evaluation = load_benchmark(BenchmarkSpec(name="humaneval", prompt_format="paper", max_samples=20, seed=0))
    assert all(s.turns[0].endswith(('"""\n\n```', "'''\n\n```")) for s in evaluation)
    assert all(p.endswith(('"\n\n```', "'\n\n```")) for p in prompts)  # the docstring's last quote, as there


def test_a_seeded_code_near_duplicate_is_caught_and_never_a_training_prompt(monkeypatch):
    original = humaneval_prompts()[0]  # has_close_elements, with doctests
    renamed = original.replace("has_close_elements", "any_two_close").replace("Check if", "Tell whether")
    near = renamed[renamed.index("def ") :].replace("    ", "  ")  # no import, other indentation
    assert near_humaneval()(near) and near_humaneval()('def median(xs):\n    """Middle value."""\n')
    assert not near_humaneval()('def middle(xs):\n    """Middle value."""\n')
    headers = stdlib_code_prompts(300, seed=0)
    with pytest.raises(AssertionError, match="near-duplicates"):
        assert_code_apart([*headers, near], humaneval_prompts())
    # seeded into the stdlib's headers, it is left out
    files, file_headers = tiny_code_prompts.stdlib_source_files(), tiny_code_prompts._file_headers
    monkeypatch.setattr(tiny_code_prompts, "_file_headers", lambda path: file_headers(path) + ((near,) if path == files[0] else ()))
    seeded = stdlib_code_prompts(400, seed=0)  # every doctest header first: it would be among them
    assert near not in seeded
    monkeypatch.setattr(tiny_code_prompts, "near_humaneval", lambda: lambda text: False)
    assert near in stdlib_code_prompts(400, seed=0)
