"""The `dspark` method record (dflash/methods/dspark.py): its settings and the drafter it needs
are one-line errors naming the key; it builds a DSpark proposer behind a chain verifier."""

from __future__ import annotations

import re

import pytest

from dflash.dspark.proposer import DSparkProposer
from dflash.errors import ConfigError
from dflash.methods import METHODS, EvalContext, build_method
from helpers.apps import assert_one_error_line, run_main
from helpers.decoding import dspark_drafter, random_drafter

Settings = METHODS["dspark"].settings


@pytest.mark.parametrize("threshold", [-0.1, 1.0, 1.5])
def test_a_threshold_outside_0_1_is_refused(threshold):
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\)") as info:
        Settings(confidence_threshold=threshold)
    assert info.value.key == "confidence_threshold"


def test_the_evaluate_app_names_the_full_key(tmp_path, monkeypatch, capsys):
    argv = [f"paths.artifacts={tmp_path}", "methods=[dspark]", "dspark.confidence_threshold=1.5"]
    assert_one_error_line(*run_main("evaluate", argv, monkeypatch, capsys), "dspark.confidence_threshold", "must be in [0, 1)")


@pytest.mark.parametrize(
    "drafter, settings, draft_threshold, key, text",
    [
        ("dflash", Settings(), 0.0, "drafter.path", "holds a DFlashDraftModel (no Markov head)"),
        ("markov only", Settings(confidence_threshold=0.5), 0.0, "dspark.confidence_threshold", "no confidence head"),
        ("dspark", Settings(), 0.3, "decoding.draft_threshold", "dspark.confidence_threshold"),
    ],
)
def test_what_the_drafter_lacks_is_a_one_line_error(qwen3_target, drafter, settings, draft_threshold, key, text):
    built = {
        "dflash": lambda: random_drafter(qwen3_target, block_size=4),
        "markov only": lambda: dspark_drafter(qwen3_target, confidence=False, block_size=4),
        "dspark": lambda: dspark_drafter(qwen3_target, block_size=4),
    }[drafter]()
    context = EvalContext(drafter=built, drafter_label="random", draft_threshold=draft_threshold)
    with pytest.raises(ConfigError, match=re.escape(text)) as info:
        build_method("dspark", qwen3_target, settings, context)
    assert info.value.key == key


def test_it_builds_a_dspark_proposer_with_chain_verification(qwen3_target):
    context = EvalContext(drafter=dspark_drafter(qwen3_target, block_size=4), drafter_label="d")
    setup = build_method("dspark", qwen3_target, Settings(confidence_threshold=0.25), context)
    assert isinstance(setup.proposer, DSparkProposer) and setup.proposer.confidence_threshold == 0.25
    assert (setup.verifier.name, setup.block_size, setup.trained_block_size, setup.label) == ("chain", 4, 4, "d")
    assert METHODS["dspark"].recorded(Settings(0.25), context) == {
        "block_size": None,
        "confidence_threshold": 0.25,
        "lookup_ngram": None,
    }
