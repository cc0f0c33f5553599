"""Confidence-adaptive drafts for the chain (issue 14, item 2: `decoding.draft_threshold`).

Verifying B tokens when the drafter is unsure costs more than an autoregressive step
and buys little. `ThresholdProposer` wraps any proposer and keeps only the leading
slots whose cumulative confidence (product of each slot's top probability, the chance
that greedy verification accepts them all if the drafter is calibrated) stays at or
above the threshold; the first slot is always kept. Tree verification applies the same
cut to its path scores (`build_tree(min_score=...)`).

Lossless whatever it keeps: it only shortens the draft, and the verify loop handles a
draft of any length k >= 1 (it reads k from the rows returned, which may therefore be
fewer than `num_drafts`).
"""

from __future__ import annotations

import torch

from dflash.decoding.proposer import BlockProposer
from dflash.decoding.verify import propose_tokens


def confident_prefix_length(draft_logits: torch.Tensor, threshold: float) -> int:
    """How many leading slots of (k, V) logits keep prod(top probability) >= threshold (>= 1)."""
    confidence = draft_logits.float().softmax(-1).amax(-1).cumprod(0)
    return max(1, int((confidence >= threshold).sum()))


class ThresholdProposer:
    """`proposer` with its drafts cut where the cumulative confidence drops below `threshold`.

    propose returns (k, V) logits with 1 <= k <= num_drafts.
    """

    def __init__(self, proposer: BlockProposer, threshold: float):
        self.proposer = proposer
        self.threshold = threshold
        self.target_layer_ids = proposer.target_layer_ids

    def reset(self) -> None:
        self.proposer.reset()

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        return propose_tokens(self.propose(committed_ids, new_features, block_size, num_drafts), sampling, generator)

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        logits = self.proposer.propose(committed_ids, new_features, block_size, num_drafts)
        return logits[: confident_prefix_length(logits, self.threshold)]
