"""Chain verification: the drafts form one block after the anchor, verified causally.

Per step the proposer drafts up to B-1 tokens (DFlash: a block [anchor, mask x (B-1)] in
one forward; a proposer may return fewer, even none), the target runs once over
[anchor, drafts] at positions anchor + 0..k with its causal mask, `verify` keeps the
longest agreeing prefix (or, sampling, the rejection sampler's) plus one token of the
target's own, and the cache is cropped to the committed length. The loop itself, its
invariants and its record live in `dflash.decoding.loop`.
"""

from __future__ import annotations

import torch

from dflash.decoding.proposer import Proposer
from dflash.decoding.sampling import SamplingConfig
from dflash.decoding.verify import Drafts, verify
from dflash.target import TargetModel, crop_cache


def _check_drafts(drafts: Drafts, num_drafts: int) -> None:
    """A proposer broke its contract: a bug in it, named before verification goes wrong."""
    k = drafts.tokens.numel()
    if drafts.tokens.dim() != 1 or k > num_drafts:
        shape = tuple(drafts.tokens.shape)
        raise RuntimeError(f"the proposer drafted tokens of shape {shape}; expected (k,), k <= {num_drafts}")
    if drafts.probs is not None and drafts.probs.shape[0] != k:
        raise RuntimeError(f"the proposer returned {drafts.probs.shape[0]} distributions for {k} draft tokens")


class ChainVerifier:
    """Drafts (k,) in a row after the anchor; accepts a leading run of them (`verify`)."""

    name = "chain"

    @staticmethod
    def check(target: TargetModel, sampling: SamplingConfig) -> None:
        """Every target and sampling setting works with a chain."""

    @staticmethod
    def draft(proposer: Proposer, committed_ids, new_features, block_size, num_drafts, sampling, generator) -> Drafts:
        """The proposer's drafts, checked against its contract."""
        drafts = proposer.draft(committed_ids, new_features, block_size, num_drafts, sampling, generator)
        _check_drafts(drafts, num_drafts)
        return drafts

    @staticmethod
    def rebuild(draft_tokens: torch.Tensor, parents=None) -> Drafts:
        """Drafts of these tokens; the draft distributions are not needed to lay them out again."""
        return Drafts(tokens=draft_tokens)

    @staticmethod
    def layout(drafts: Drafts, anchor_position: int, device) -> tuple[torch.Tensor, None]:
        """Positions anchor_position + 0..k (1, k + 1); causal attention (no mask)."""
        size = drafts.tokens.numel() + 1
        return torch.arange(anchor_position, anchor_position + size, device=device).unsqueeze(0), None

    @staticmethod
    def accept(drafts: Drafts, target_logits: torch.Tensor, sampling, generator) -> tuple[list[int], int]:
        """Rows 0..accepted (the anchor and the kept drafts) and the target's token after them."""
        accepted, next_token = verify(target_logits, drafts, sampling, generator)
        return list(range(accepted + 1)), next_token

    @staticmethod
    def compact(cache, anchor_position: int, kept_rows: list[int]) -> None:
        """The kept rows are a leading run: crop the cache after them."""
        crop_cache(cache, anchor_position + len(kept_rows))
