"""Proposers: what drafts the tokens of a verify step during speculative decoding.

A proposer sees the committed token ids and the target features of context positions
it has not seen yet (each delivered exactly once over a request), and drafts in one of
two ways; the engine does not care how, and tests plug in doubles (e.g. an oracle that
runs the target):
- `Proposer.propose`: drafter logits for block slots 1..num_drafts, all at once (DFlash);
  the loop turns them into tokens (argmax, or samples at T > 0).
- `TokenProposer.draft`: the draft tokens themselves, with the distributions they were
  drawn from, and possibly fewer than asked (even none). For drafters whose slot i + 1
  depends on the token chosen at slot i (EAGLE-3's chain) and deterministic ones (prompt
  lookup: `dflash.decoding.ngram`). The engine calls `draft` when a proposer has it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from dflash.decoding.sampling import SamplingConfig
from dflash.decoding.verify import Drafts


class Proposer(Protocol):
    #: target layers whose features the proposer needs (None: no features).
    target_layer_ids: list[int] | None

    def reset(self) -> None:
        """Forget the previous request."""

    def propose(
        self, committed_ids: torch.Tensor, new_features: torch.Tensor | None, block_size: int, num_drafts: int
    ) -> torch.Tensor:
        """Draft logits for one block.

        Args:
            committed_ids: (1, L) every committed token; the anchor is the last, at position L-1.
            new_features: (1, n, F) target features of positions [L-1-n, L-1), the context
                the proposer has not seen; every position before the anchor is delivered
                exactly once over a request.
            block_size: B; the block is [anchor, mask x (B-1)].
            num_drafts: how many slots to return, 1 <= num_drafts <= B-1.
        Returns:
            (num_drafts, vocab) logits for slots 1..num_drafts.
        """


class TokenProposer(Protocol):
    #: target layers whose features the proposer needs (None: no features).
    target_layer_ids: list[int] | None

    def reset(self) -> None:
        """Forget the previous request."""

    def draft(
        self,
        committed_ids: torch.Tensor,
        new_features: torch.Tensor | None,
        num_drafts: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Drafts:
        """Draft up to `num_drafts` tokens after the committed ones.

        Args:
            committed_ids, new_features: as in `Proposer.propose`.
            num_drafts: the most tokens the engine will verify, >= 1.
            sampling / generator: how to choose each token (argmax when greedy, else a
                sample from the drafter's filtered distribution, with this generator).
        Returns:
            Drafts with tokens (k,), 0 <= k <= num_drafts, on the ids' device, and probs
            (k, vocab): the distributions the tokens were drawn from when sampling; None
            for a deterministic proposer (one-hot at each token).
        """
