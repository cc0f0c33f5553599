"""The evaluator's arithmetic under partial acceptance, unequal output lengths and a lossy engine.

`evaluate()` runs for real; only its drafter is replaced (through
`DFlashProposer.for_target`) by `PartialOracleProposer`, which accepts a planned number of
drafts per step. The tests recompute tau, the acceptance histogram and per-prompt tau
from that plan and the output lengths, independently of `dflash.eval.results`.
"""

from __future__ import annotations

from collections import Counter

import pytest

from dflash.decoding import SamplingConfig, chain
from dflash.eval import DecodingSettings, EvalSettings, Sample, evaluate
from dflash.eval.results import GenerationRecord, build_results
from dflash.layout import Results
from dflash.specs import DrafterSpec, build_drafter
from helpers.decoding import PartialOracleProposer, lossy_verify

BLOCK_SIZE = 4
MAX_NEW_TOKENS = 24
SAMPLES = [Sample(turns=["def add(a, b):"], index=0), Sample(turns=["Hello", "Tell me more."], index=5)]
WARMUP_TOKENS = 4


class RecordingPartialOracle(PartialOracleProposer):
    """`PartialOracleProposer` that keeps each request's plan (the engine resets it per request)."""

    def __init__(self, target, seed: int = 0):
        super().__init__(target, seed)
        self.requests: list[list[int]] = []

    def reset(self):
        super().reset()
        self.requests.append(self.planned_accepts)


def evaluate_with(target, proposer, monkeypatch, hf_generate=False) -> Results:
    """A greedy `evaluate()` of SAMPLES at block size BLOCK_SIZE with `proposer` as the drafter."""
    monkeypatch.setattr("dflash.dflash.proposer.DFlashProposer.for_target", lambda *args: proposer)  # the dflash method builds it
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=BLOCK_SIZE), target)
    decoding = DecodingSettings(block_size=BLOCK_SIZE, max_new_tokens=MAX_NEW_TOKENS)
    settings = EvalSettings(decoding=decoding, hf_generate=hf_generate, warmup_tokens=WARMUP_TOKENS)
    return evaluate(target, drafter, SAMPLES, settings, progress=False)


def expected_lengths(planned: list[int], num_output_tokens: int) -> list[int]:
    """Tokens each verify step should emit: planned accepts + 1 (the bonus token), the last
    step cut where the output ended (stop token or max_new_tokens); a step with a single
    token left drafts nothing, so the proposer is not asked and it emits 1."""
    lengths, remaining = [], num_output_tokens - 1  # the first token comes from prefill
    for accepted in planned:
        assert remaining > 0, "the proposer was asked for a block after the output ended"
        lengths.append(min(accepted + 1, remaining))
        remaining -= lengths[-1]
    assert remaining in (0, 1)
    return lengths + [1] * remaining


def test_tau_histogram_and_per_prompt_tau_follow_the_accepted_drafts(tiny_target, monkeypatch):
    proposer = RecordingPartialOracle(tiny_target, seed=1)
    results = evaluate_with(tiny_target, proposer, monkeypatch)
    assert results.lossless is True
    warmup, *requests = proposer.requests  # the untimed warm-up must not be counted
    assert len(warmup) > 0 and len(requests) == results.num_generations == 3

    per_request = [expected_lengths(planned, entry["num_tokens"]["dflash"]) for planned, entry in zip(requests, results.per_prompt)]
    pooled = [length for lengths in per_request for length in lengths]
    counts = Counter(pooled)
    assert results.acceptance_histogram == [counts[length] for length in range(1, BLOCK_SIZE + 1)]
    # every accept length 0..B-1 occurred, so each histogram entry is exercised
    assert all(counts[length] > 0 for length in range(1, BLOCK_SIZE + 1))
    assert results.tau == pytest.approx(sum(pooled) / len(pooled))
    for entry, lengths in zip(results.per_prompt, per_request):
        assert entry["tau"] == pytest.approx(sum(lengths) / len(lengths))
    # pooled and per-prompt averages differ here, so confusing them would show
    per_prompt_mean = sum(sum(lengths) / len(lengths) for lengths in per_request) / len(per_request)
    assert per_prompt_mean != pytest.approx(results.tau)


def test_lossy_engine_is_reported_with_its_first_mismatch(qwen3_target, monkeypatch):
    monkeypatch.setattr(chain, "verify", lossy_verify)
    proposer = RecordingPartialOracle(qwen3_target, seed=1)
    results = evaluate_with(qwen3_target, proposer, monkeypatch, hf_generate=True)
    assert results.lossless is False
    assert results.hf_generate_matches is True  # the baselines are untouched
    # The first generation's first rejected draft is kept: its output position is the
    # prefill token plus every token emitted before that step, plus the drafts accepted in it.
    planned = proposer.requests[1]
    step = next(i for i, accepted in enumerate(planned) if accepted < BLOCK_SIZE - 1)
    position = 1 + sum(accepted + 1 for accepted in planned[:step]) + planned[step]
    mismatch = results.first_mismatch
    assert (mismatch["prompt_index"], mismatch["turn"], mismatch["position"]) == (SAMPLES[0].index, 0, position)
    # the double's wrong draft is the target's token + 1 (mod vocab)
    vocab_size = qwen3_target.model.config.vocab_size
    assert mismatch["got"] == (mismatch["expected"] + 1) % vocab_size


def test_speedup_counts_tokens_when_methods_emit_different_lengths():
    """Sampling: each method stops at its own stop token, so output lengths differ."""
    times = {"autoregressive": 2.0, "dflash": 0.5, "hf_generate": 1.0}
    records = [
        GenerationRecord(0, 0, 3, {"autoregressive": [7] * 10, "dflash": [7] * 4, "hf_generate": [7] * 20}, dict(times), [2, 1]),
        GenerationRecord(1, 0, 3, {"autoregressive": [7] * 30, "dflash": [7] * 16, "hf_generate": [7] * 10}, dict(times), [4] * 4),
    ]
    results = build_results(
        records, benchmark="b", target="t", drafter="d", block_size=4, drafter_block_size=4,
        sampling=SamplingConfig(temperature=1.0), max_new_tokens=32, stop_token_ids=[0], device="cpu",
    )  # fmt: skip
    # tokens per second: summed tokens over summed seconds
    assert results.tokens_per_s == pytest.approx({"autoregressive": 40 / 4.0, "dflash": 20 / 1.0, "hf_generate": 30 / 2.0})
    assert results.speedup["vs_autoregressive"] == pytest.approx((20 / 1.0) / (40 / 4.0))
    assert results.speedup["vs_hf_generate"] == pytest.approx((20 / 1.0) / (30 / 2.0))
    # a speedup from time alone (4x and 2x here) would be far off
    assert results.speedup["vs_autoregressive"] != pytest.approx(4.0)
    assert [p["num_tokens"] for p in results.per_prompt] == [
        {"autoregressive": 10, "dflash": 4, "hf_generate": 20}, {"autoregressive": 30, "dflash": 16, "hf_generate": 10},
    ]  # fmt: skip
    assert results.tau == pytest.approx((2 + 1 + 4 * 4) / 6)
    assert results.lossless is None  # sampling: no greedy equality to check
