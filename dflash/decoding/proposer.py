"""Proposers: what drafts the tokens of a verify step during speculative decoding
(`Proposer.draft` states the contract).

Drafters whose slot i + 1 depends on the token chosen at slot i (EAGLE-3's chain) draft
token by token; deterministic ones (prompt lookup: `dflash.decoding.ngram`) look tokens up;
a block drafter (DFlash) also has the logits of a whole block at once
(`BlockProposer.propose`), which tree verification expands, and drafts by `propose_tokens`
of them. Tests plug in doubles (e.g. an oracle that runs the target).
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

    def draft(
        self,
        committed_ids: torch.Tensor,
        new_features: torch.Tensor | None,
        block_size: int,
        num_drafts: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Drafts:
        """Draft up to `num_drafts` tokens after the committed ones.

        Args:
            committed_ids: (1, L) every committed token; the anchor is the last, at position L-1.
            new_features: (1, n, F) target features of positions [L-1-n, L-1), the context
                the proposer has not seen; every position before the anchor is delivered
                exactly once over a request.
            block_size: B, the verify width (a block drafter drafts [anchor, mask x (B-1)]).
            num_drafts: the most tokens the loop will verify, 1 <= num_drafts <= B-1.
            sampling / generator: how to choose each token (argmax when greedy, else a
                sample from the drafter's filtered distribution, with this generator).
        Returns:
            Drafts with tokens (k,), 0 <= k <= num_drafts, on the ids' device, and probs
            (k, vocab): the distributions the tokens were drawn from when sampling; None
            for a deterministic proposer (one-hot at each token).
        """


class BlockProposer(Proposer, Protocol):
    def propose(
        self, committed_ids: torch.Tensor, new_features: torch.Tensor | None, block_size: int, num_drafts: int
    ) -> torch.Tensor:
        """Draft logits (k, vocab) for block slots 1..k, k <= num_drafts, all at once
        (arguments as in `draft`); `draft` is `propose_tokens` of them."""
