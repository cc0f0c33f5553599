"""Chain verification: the drafts form one block after the anchor, verified causally.

Per step the proposer drafts up to B-1 tokens (DFlash: a block [anchor, mask x (B-1)] in
one forward; a `TokenProposer` may return fewer, even none), the target runs once over
[anchor, drafts] at positions anchor + 0..k with its causal mask, `verify` keeps the
longest agreeing prefix (or, sampling, the rejection sampler's) plus one token of the
target's own, and the cache is cropped to the committed length. The loop itself, its
invariants and its record live in `dflash.decoding.loop`.
"""

from __future__ import annotations

import torch

from dflash.decoding.loop import GenerationResult, decode, synchronize, target_token
from dflash.decoding.proposer import Proposer, TokenProposer
from dflash.decoding.sampling import SamplingConfig
from dflash.decoding.verify import Drafts, propose_tokens, verify
from dflash.target import TargetModel, crop_cache

__all__ = ["ChainVerifier", "GenerationResult", "generate", "synchronize", "target_token"]


def _check_drafts(drafts: Drafts, num_drafts: int) -> None:
    """A `TokenProposer` broke its contract: a bug in it, named before verification goes wrong."""
    k = drafts.tokens.numel()
    if drafts.tokens.dim() != 1 or k > num_drafts:
        shape = tuple(drafts.tokens.shape)
        raise RuntimeError(f"the proposer drafted tokens of shape {shape}; expected (k,), k <= {num_drafts}")
    if drafts.probs is not None and drafts.probs.shape[0] != k:
        raise RuntimeError(f"the proposer returned {drafts.probs.shape[0]} distributions for {k} draft tokens")


class ChainVerifier:
    """Drafts (k,) in a row after the anchor; accepts a leading run of them (`verify`)."""

    name = "chain"

    def __init__(self, block_size: int):
        self.block_size = block_size

    def check(self, target: TargetModel, sampling: SamplingConfig) -> None:
        """Every target and sampling setting works with a chain."""

    def draft(self, proposer, committed_ids, new_features, num_drafts, sampling, generator) -> Drafts:
        """Through `draft` when the proposer has one (`TokenProposer`), else `propose` and `propose_tokens`."""
        if hasattr(proposer, "draft"):
            drafts = proposer.draft(committed_ids, new_features, num_drafts, sampling, generator)
            _check_drafts(drafts, num_drafts)
            return drafts
        draft_logits = proposer.propose(committed_ids, new_features, self.block_size, num_drafts)
        return propose_tokens(draft_logits, sampling, generator)

    @staticmethod
    def rebuild(draft_tokens: torch.Tensor, parents=None) -> Drafts:
        """Drafts of these tokens; the draft distributions are not needed to lay them out again."""
        return Drafts(tokens=draft_tokens)

    @staticmethod
    def layout(drafts: Drafts, anchor_position: int, dtype, device) -> tuple[torch.Tensor, None]:
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


def generate(
    target: TargetModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    block_size: int = 1,
    proposer: Proposer | TokenProposer | None = None,
    stop_token_ids: list[int] | tuple[int, ...] = (),
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `input_ids`, losslessly (chain verification).

    Args:
        target: the frozen target.
        input_ids: (1, P) prompt ids, P >= 1.
        block_size: B, the verify width: at most B-1 drafts per step; 1 is autoregressive
            decoding (no proposer needed).
        proposer: drafts when B > 1: through `draft` when it has one (`TokenProposer`),
            else through `propose` and `propose_tokens`.
        stop_token_ids: generation ends right after the first of these it emits.
        generator: torch RNG for sampling (on the target's device), for reproducibility.
    Returns:
        the output, its measurements and the record of its verify forwards (`GenerationResult`).
    """
    return decode(
        target, input_ids, ChainVerifier(block_size), proposer, max_new_tokens=max_new_tokens, block_size=block_size,
        stop_token_ids=stop_token_ids, sampling=sampling, generator=generator,
    )  # fmt: skip
