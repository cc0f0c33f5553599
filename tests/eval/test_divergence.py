"""Divergence diagnosis: bf16 near-ties are `numerical`, a wrong verifier is a `bug`.

The bf16 targets are the tiny random targets cast to bfloat16 (CPU bf16 matmuls work
and a 20-token generation takes well under a second at one thread). Which positions
diverge depends on how the hardware rounds; the prompts below diverge on x86 CPUs with
torch 2.13 (found by scanning short prompts), for the chain and for the tree alike, and
the tests check that they saw some.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import dflash.decoding.chain as chain
import dflash.decoding.tree as tree
import dflash.eval.evaluator as evaluator
from dflash.decoding import TreeVerifier, generate
from dflash.decoding.token_tree import ROOT
from dflash.decoding.tree import accepted_path as exact_walk
from dflash.dflash.proposer import DFlashProposer
from dflash.eval import DecodingSettings, EvalSettings, Sample, evaluate
from dflash.eval.divergence import (
    BUG,
    NUMERICAL,
    TIE_ULPS,
    diagnose,
    hf_generate_logits,
    replay_logits,
    tie_tolerance,
)  # fmt: skip
from dflash.eval.results import GenerationRecord, divergences
from dflash.methods.dflash_tree import TreeSettings
from dflash.specs import DrafterSpec, build_drafter
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import lossy_verify

DIVERGING_PROMPTS = ["add item def", "print print sum", "total result add"]


@pytest.fixture(scope="module")
def bf16_target() -> TargetModel:
    model, tokenizer = build_tiny_target("qwen3", seed=0)
    return TargetModel(model.to(torch.bfloat16), tokenizer)


def bf16_settings(max_new_tokens: int, hf_generate: bool) -> EvalSettings:
    decoding = DecodingSettings(block_size=8, max_new_tokens=max_new_tokens)
    return EvalSettings(decoding=decoding, chat_template=False, hf_generate=hf_generate, warmup_tokens=0)


def test_tolerance_is_a_few_rounding_steps_of_the_dtype_at_the_logits_scale():
    logits = torch.tensor([3.0, -9.5, 0.25])  # largest magnitude 9.5: exponent 3
    assert tie_tolerance(logits, torch.bfloat16) == TIE_ULPS * 2.0**-7 * 8
    assert tie_tolerance(logits, torch.float32) == TIE_ULPS * 2.0**-23 * 8
    assert tie_tolerance(logits / 8, torch.bfloat16) == TIE_ULPS * 2.0**-7


def test_the_same_gap_is_a_tie_in_bf16_and_a_bug_in_float32():
    gap = 0.01  # a bf16 step at 1.0 is 0.0078, a float32 step 1.2e-7
    baseline = torch.tensor([1.0, 1.0 - gap, -1.0])  # chose token 0
    candidate = torch.tensor([1.0 - gap, 1.0, -1.0])  # chose token 1
    tie = diagnose(5, 0, 1, baseline, candidate, torch.bfloat16)
    assert tie["kind"] == NUMERICAL and tie["baseline"]["gap"] == pytest.approx(gap)
    assert diagnose(5, 0, 1, baseline, candidate, torch.float32)["kind"] == BUG
    # a token the candidate's own computation ranks far below the top is a bug in any dtype
    wrong = diagnose(5, 0, 2, baseline, candidate, torch.bfloat16)
    assert wrong["kind"] == BUG and wrong["candidate"]["gap"] == pytest.approx(2.0)
    # one output ended before the other: nothing to compare, a bug
    assert diagnose(5, 0, None, None, None, torch.bfloat16)["kind"] == BUG


def test_an_undiagnosed_divergence_counts_as_a_bug():
    record = GenerationRecord(0, 0, 3, {"autoregressive": [1, 2, 3], "dflash": [1, 2, 4]})
    summary = divergences([record], "dflash")
    assert (summary["numerical"], summary["bug"]) == (0, 1)
    assert summary["details"][0]["position"] == 2 and summary["details"][0]["tolerance"] is None


def run_and_replay(target, monkeypatch, run) -> tuple[object, list[tuple], list[tuple]]:
    """(result of `run()`, the target forwards it issued, the forwards of replaying every
    output position): each forward as (input ids, positions, mask or None, logits)."""
    forward = target.forward
    calls: list[tuple] = []

    def recording_forward(ids, positions, *args, **kwargs):
        out = forward(ids, positions, *args, **kwargs)
        calls.append((ids.clone(), positions.clone(), kwargs.get("attention_mask"), out.logits.clone()))
        return out

    monkeypatch.setattr(target, "forward", recording_forward)
    result = run()
    issued, calls[:] = list(calls), []
    return result, issued, calls


@pytest.mark.parametrize("method", ["autoregressive", "chain", "tree"])
def test_replay_issues_the_runs_forwards_and_reproduces_its_logits_bit_for_bit(bf16_target, monkeypatch, method):
    """The replay issues exactly the run's target forwards (ids, positions, mask), for every
    verifier, and returns the very logits row each output token was chosen from."""
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), bf16_target)
    proposer = DFlashProposer(drafter, bf16_target.embed, bf16_target.logits)
    input_ids = bf16_target.tokenizer("def add(a, b):", return_tensors="pt").input_ids
    runs = {
        "autoregressive": lambda: generate(bf16_target, input_ids, max_new_tokens=14),
        "chain": lambda: generate(bf16_target, input_ids, max_new_tokens=14, block_size=4, proposer=proposer),
        "tree": lambda: generate(
            bf16_target, input_ids, max_new_tokens=14, proposer=proposer, block_size=4, verifier=TreeVerifier(6)
        ),  # fmt: skip
    }
    run, issued, replayed_calls = run_and_replay(bf16_target, monkeypatch, runs[method])
    assert len(issued) == 1 + len(run.steps) and run.steps[0].verifier == ("tree" if method == "tree" else "chain")
    # the record agrees with the result: its emitted tokens are the output, its drafts the counts
    assert run.output_ids == run.output_ids[:1] + [token for step in run.steps for token in step.emitted]
    assert [len(step.input_ids) - 1 for step in run.steps] == run.draft_counts
    assert [len(step.emitted) for step in run.steps] == run.acceptance_lengths
    starts = [1 + sum(run.acceptance_lengths[:step]) for step in range(run.num_steps)]
    for position in range(len(run.output_ids)):
        replayed = replay_logits(bf16_target, input_ids, run.steps, position)
        step = max((s for s, start in enumerate(starts) if start <= position), default=-1)
        row = -1 if step < 0 else run.steps[step].kept_rows[position - starts[step]]
        assert torch.equal(replayed, issued[step + 1][3][0, row]), (method, position)
        assert int(replayed.argmax()) == run.output_ids[position]
    # the longest replay re-issued the run's forwards one for one
    last_replay = replayed_calls[-(len(issued)) :]
    for (ids, positions, mask, _), (ids2, positions2, mask2, _) in zip(issued, last_replay):
        assert torch.equal(ids, ids2) and torch.equal(positions, positions2)
        assert (mask is None and mask2 is None) or torch.equal(mask, mask2)


def test_bf16_divergences_are_near_ties_and_results_json_says_so(bf16_target, tmp_path):
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=8), bf16_target)
    samples = [Sample(turns=[text], index=i) for i, text in enumerate(DIVERGING_PROMPTS)]
    results = evaluate(bf16_target, drafter, samples, bf16_settings(20, hf_generate=True), progress=False)
    results = json.load(open(results.write(str(tmp_path / "results.json"))))
    found = results["divergences"]
    assert found["numerical"] >= 1, "no bf16 divergence on these prompts: pick prompts that diverge on this machine"
    assert results["target_dtype"] == "bfloat16"
    assert results["lossless"] is False and results["lossless_up_to_ties"] is True
    assert found["bug"] == 0 and len(found["details"]) == found["numerical"]
    for detail in found["details"]:
        assert detail["kind"] == NUMERICAL and detail["expected"] != detail["got"]
        # each computation chose its own token: the other one is at most the tolerance below it
        assert detail["baseline"]["top_logit"] == detail["baseline"]["expected_logit"]
        assert detail["candidate"]["top_logit"] == detail["candidate"]["got_logit"]
        assert 0 <= detail["baseline"]["gap"] <= detail["tolerance"]
        assert 0 <= detail["candidate"]["gap"] <= detail["tolerance"]
    assert [(d["prompt_index"], d["position"]) for d in found["details"]][0] == (
        results["first_mismatch"]["prompt_index"], results["first_mismatch"]["position"],
    )  # fmt: skip
    hf = results["hf_generate_divergences"]
    assert hf["bug"] == 0 and results["hf_generate_matches"] == (hf["numerical"] == 0)


def test_a_verifier_that_keeps_a_wrong_draft_is_a_bug(bf16_target, monkeypatch):
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), bf16_target)
    monkeypatch.setattr(chain, "verify", lossy_verify)  # keeps the first rejected draft
    samples = [Sample(turns=["def add(a, b):"], index=7)]
    results = evaluate(bf16_target, drafter, samples, bf16_settings(10, hf_generate=False), progress=False)
    assert results.lossless is False and results.lossless_up_to_ties is False
    (detail,) = results.divergences["details"]
    assert results.divergences["bug"] == 1 and detail["kind"] == BUG
    assert detail["prompt_index"] == 7 and detail["position"] == results.first_mismatch["position"]
    # the target's own verify forward ranked the kept draft far below its top token
    assert detail["candidate"]["gap"] > 10 * detail["tolerance"]
    assert detail["candidate"]["top_logit"] == detail["candidate"]["expected_logit"]


def tree_settings(max_new_tokens: int) -> EvalSettings:
    settings = bf16_settings(max_new_tokens, hf_generate=False)
    return replace(settings, methods=["dflash_tree"], method_settings={"dflash_tree": TreeSettings(budget=8)})


def test_bf16_divergences_of_tree_verification_are_near_ties(bf16_target):
    """Tree runs are replayed too: their bf16 divergences are diagnosed, not counted as bugs."""
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=8), bf16_target)
    samples = [Sample(turns=[text], index=i) for i, text in enumerate(DIVERGING_PROMPTS)]
    results = evaluate(bf16_target, drafter, samples, tree_settings(20), progress=False)
    found = results.divergences
    assert found["numerical"] >= 1, "no bf16 divergence on these prompts: pick prompts that diverge on this machine"
    assert results.lossless is False and results.lossless_up_to_ties is True
    assert found["bug"] == 0 and len(found["details"]) == found["numerical"]
    for detail in found["details"]:
        assert detail["candidate"]["top_logit"] == detail["candidate"]["got_logit"]
        assert 0 <= detail["candidate"]["gap"] <= detail["tolerance"]


def walk_that_keeps_a_wrong_node(tree, target_logits, sampling, generator):
    """Tree walk that, where the target's token has no child, keeps the first child anyway."""
    path, token = exact_walk(tree, target_logits, sampling, generator)
    children = tree.children()[path[-1] if path else ROOT]
    if not children:
        return path, token
    path = path + [next(iter(children.values()))]
    return path, int(target_logits[path[-1] + 1].argmax())


def test_a_tree_walk_that_keeps_a_wrong_node_is_a_bug(bf16_target, monkeypatch):
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), bf16_target)
    monkeypatch.setattr(tree, "accepted_path", walk_that_keeps_a_wrong_node)
    samples = [Sample(turns=["def add(a, b):"], index=7)]
    results = evaluate(bf16_target, drafter, samples, tree_settings(10), progress=False)
    assert results.lossless is False and results.lossless_up_to_ties is False
    (detail,) = results.divergences["details"]
    assert results.divergences["bug"] == 1 and detail["kind"] == BUG
    assert detail["prompt_index"] == 7 and detail["position"] == results.first_mismatch["position"]
    # the target's own tree forward (replayed) ranked the kept node far below its top token
    assert detail["candidate"]["gap"] > 10 * detail["tolerance"]
    assert detail["candidate"]["top_logit"] == detail["candidate"]["expected_logit"]


def test_hf_generate_replay_stops_early_with_the_same_logits(bf16_target):
    input_ids = bf16_target.tokenizer("print print sum", return_tensors="pt").input_ids
    options = dict(do_sample=False, eos_token_id=None, pad_token_id=bf16_target.tokenizer.pad_token_id)
    full = bf16_target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=8,
                                      output_logits=True, return_dict_in_generate=True, **options)  # fmt: skip
    for position in (0, 5):
        replayed = hf_generate_logits(bf16_target, input_ids, position, options)
        assert torch.equal(replayed, full.logits[position][0].float())


def test_an_hf_generate_output_off_the_targets_ranking_is_a_bug(qwen3_target, monkeypatch):
    """The HF side of the diagnosis: a (doubled) HF generate that emits a wrong token at position 3."""
    timed_hf_generate = evaluator._Methods._hf_generate

    def wrong_at_three(self, input_ids, max_new_tokens, seed):
        tokens, seconds = timed_hf_generate(self, input_ids, max_new_tokens, seed)
        return tokens[:3] + [(tokens[3] + 1) % 256], seconds

    monkeypatch.setattr(evaluator._Methods, "_hf_generate", wrong_at_three)
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)
    settings = EvalSettings(decoding=DecodingSettings(max_new_tokens=8), chat_template=False, warmup_tokens=0)
    results = evaluate(qwen3_target, drafter, [Sample(turns=["def add(a, b):"], index=0)], settings, progress=False)
    assert results.lossless is True and results.hf_generate_matches is False
    (detail,) = results.hf_generate_divergences["details"]
    assert (detail["position"], detail["kind"]) == (3, BUG)
    # HF generate's own computation (replayed) ranks the emitted token below the baseline's
    assert detail["candidate"]["top_logit"] == detail["candidate"]["expected_logit"] > detail["candidate"]["got_logit"]
