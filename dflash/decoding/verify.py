"""Verification rules: which draft tokens the target keeps, and its own next token.

Every rule emits `accepted` draft tokens plus one token from the target, so a verify
step of k drafts emits between 1 and k + 1 tokens; each emitted token has exactly the
target's distribution given the tokens before it (lossless).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash.decoding.sampling import SamplingConfig, probabilities, sample
from dflash.engine import argmax


@dataclass
class Drafts:
    """Draft tokens of one verify step: tokens (k,), k >= 0, and the distributions (k, vocab)
    they were sampled from. probs None means a deterministic proposal: the distribution is
    one-hot at each token (greedy drafting, prompt lookup); rejection sampling handles it
    exactly (accept with probability p(x), else resample from p without x).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


def propose_tokens(draft_logits: torch.Tensor, sampling: SamplingConfig, generator) -> Drafts:
    """Turn drafter logits (k, vocab) into draft tokens: argmax when greedy, else samples."""
    if sampling.greedy:
        return Drafts(tokens=argmax(draft_logits))
    probs = probabilities(draft_logits, sampling)
    return Drafts(tokens=sample(probs, generator), probs=probs)


def verify(target_logits: torch.Tensor, drafts: Drafts, sampling: SamplingConfig, generator) -> tuple[int, int]:
    """Decide how many drafts to keep.

    Args:
        target_logits: (k + 1, vocab); row i is the target's prediction after the anchor
            and drafts[:i].
        drafts: k draft tokens (k may be 0).
    Returns:
        (accepted, next_token): the first `accepted` drafts are kept, then `next_token`.
    """
    if sampling.greedy:
        return _leading_matches(drafts.tokens, argmax(target_logits))
    target_probs = probabilities(target_logits, sampling)
    if sampling.verify_rule == "match" or drafts.tokens.numel() == 0:
        return _leading_matches(drafts.tokens, sample(target_probs, generator))
    return _rejection(target_probs, drafts, generator)


def _leading_matches(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> tuple[int, int]:
    """target_tokens: (k + 1,) the target's own choice at every slot."""
    k = draft_tokens.numel()
    agree = (draft_tokens == target_tokens[:k]).int()
    accepted = int(agree.cumprod(0).sum()) if k else 0
    return accepted, int(target_tokens[accepted])


def _rejection(target_probs: torch.Tensor, drafts: Drafts, generator) -> tuple[int, int]:
    """Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023)."""
    k = drafts.tokens.numel()
    rows = torch.arange(k, device=target_probs.device)
    p = target_probs[rows, drafts.tokens]
    q = drafts.probs[rows, drafts.tokens] if drafts.probs is not None else torch.ones_like(p)
    u = torch.rand(k, generator=generator, device=target_probs.device)
    # accept draft i with probability min(1, p/q); q > 0 because the token was sampled from q
    rejected = (u * q > p).nonzero()
    if rejected.numel() == 0:
        return k, int(sample(target_probs[k], generator))
    i = int(rejected[0])
    if drafts.probs is None:  # one-hot q: max(0, p - q) is p without the rejected token
        residual = target_probs[i].clone()
        residual[drafts.tokens[i]] = 0
    else:
        residual = (target_probs[i] - drafts.probs[i]).clamp_min(0)
    total = residual.sum()
    # a rejection implies p(x) < q(x), so residual mass is positive; guard against rounding
    residual = residual / total if total > 0 else target_probs[i]
    return i, int(sample(residual, generator))
