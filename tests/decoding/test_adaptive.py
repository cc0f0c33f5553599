"""Confidence-adaptive drafts (`draft_threshold`) stay lossless and verify only confident slots.

`RunnerUpOracle` drafts the target's greedy tokens with probability ~1, except at one
planned slot per block, where a wrong token leads with probability 0.73. A threshold of
0.8 must cut the draft right before that slot (keeping at least one), so every verify
step accepts everything it verified except a lone wrong first slot.
"""

import pytest
import torch

from dflash.decoding import TreeVerifier, generate
from dflash.dflash.adaptive import ThresholdProposer, confident_prefix_length
from dflash.errors import ConfigError
from dflash.eval.settings import DecodingSettings
from dflash.structured import config_key
from helpers.decoding import LONG_PROMPT, RunnerUpOracle, hf_greedy, record_paths

THRESHOLD = 0.8


class CountingProposer(ThresholdProposer):
    """Records how many draft rows each step verifies."""

    def __init__(self, proposer, threshold):
        super().__init__(proposer, threshold)
        self.rows = []

    def propose(self, *args):
        logits = super().propose(*args)
        self.rows.append(logits.shape[0])
        return logits


def test_confident_prefix_length_follows_the_cumulative_confidence():
    top = torch.tensor([0.9, 0.85, 0.95])  # cumulative 0.9, 0.765, 0.727
    logits = torch.stack([top, 1 - top], dim=1).log()
    assert [confident_prefix_length(logits, t) for t in (0.7, 0.75, 0.8, 0.95)] == [3, 2, 1, 1]


def test_chain_with_a_threshold_stops_before_the_unsure_slot(tiny_target):
    ids = tiny_target.tokenizer(LONG_PROMPT, return_tensors="pt").input_ids
    oracle = RunnerUpOracle(tiny_target, seed=1)
    proposer = CountingProposer(oracle, THRESHOLD)
    result = generate(tiny_target, ids, max_new_tokens=40, block_size=8, proposer=proposer)
    assert result.output_ids == hf_greedy(tiny_target, ids, 40)
    planned = oracle.planned_accepts
    assert proposer.rows == [max(1, slot) for slot in planned]
    assert result.acceptance_lengths[: len(planned)] == [slot + 1 for slot in planned]


def test_tree_with_a_threshold_keeps_only_confident_nodes(tiny_target, monkeypatch):
    steps = record_paths(monkeypatch)
    ids = tiny_target.tokenizer(LONG_PROMPT, return_tensors="pt").input_ids
    oracle = RunnerUpOracle(tiny_target, seed=1)
    result = generate(tiny_target, ids, max_new_tokens=40, proposer=oracle, block_size=8, verifier=TreeVerifier(16, THRESHOLD))
    assert result.output_ids == hf_greedy(tiny_target, ids, 40)
    planned = oracle.planned_accepts
    assert [tree.size for tree, _ in steps[: len(planned)]] == [max(1, slot) for slot in planned]


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_threshold_outside_zero_one_is_a_config_error(threshold):
    """Checked once, by the `decoding` group (the proposer and the tree verifier trust it)."""
    with pytest.raises(ConfigError) as info, config_key("decoding"):
        DecodingSettings(draft_threshold=threshold)
    assert info.value.key == "decoding.draft_threshold"
