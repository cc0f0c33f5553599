"""Sampling settings and the token distributions both models are judged by.

The target's distribution is softmax(logits / temperature) restricted by top-k and
top-p; temperature 0 means greedy (argmax). Lossless decoding reproduces exactly
that distribution, whatever the drafter proposes.

Torch is only named in annotations here (the functions call tensor methods): `SamplingConfig`
is part of the `decoding` config's schema (dflash/schema.py), read before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash.errors import require

if TYPE_CHECKING:
    import torch

VERIFY_RULES = ("rejection", "match")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy; top_k 0 and top_p 1.0 disable those filters.

    verify_rule (temperature > 0 only):
      "rejection": speculative sampling with the drafter's probabilities q: accept x with
        probability min(1, p(x)/q(x)); on rejection sample from norm(max(0, p - q)).
      "match": keep draft tokens while they equal the target's own samples.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    verify_rule: str = "rejection"

    def __post_init__(self):
        require(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}")
        require(
            self.verify_rule in VERIFY_RULES,
            "verify_rule",
            f"unknown rule {self.verify_rule!r}; choose one of {VERIFY_RULES}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Sampling distribution over the vocabulary.

    Args:
        logits: (..., vocab) float logits.
    Returns:
        (..., vocab) float32 probabilities after temperature, top-k and top-p.
    """
    logits = logits.float() / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already cover top_p
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of `probs` (..., vocab) -> (...,)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return flat.multinomial(1, generator=generator).reshape(probs.shape[:-1])
