"""DSpark's heads (arXiv 2607.05147; llama.cpp build 11434 src/models/dflash.cpp:296-407).

Invariants (docs/frontier.md 1.1; tests/drafter/test_llamacpp_rules.py):
- Attribute names are the tensor names llama.cpp's converter maps
  (gguf-py/gguf/tensor_mapping.py:1479-1489): `markov_head.markov_w1.weight` (V, R),
  `markov_head.markov_w2.weight` (V, R), `confidence_head.proj.weight` (1, D + R) and
  `confidence_head.proj.bias` (1,).
- The Markov bias of a block slot is w2 · w1[prev], prev the token before the slot's (the anchor
  for slot 1), added to the slot's logits. w2 starts at zero, so a new head adds nothing: the
  drafter drafts what the DFlash drafter with the same layers drafts.
- The confidence of a slot reads [hidden state ; w1[prev]] in that order (dflash.cpp:368-382),
  never the slot's own token: a cut before slot i depends on the tokens before it only
  (docs/frontier.md 5.5), which keeps sampled decoding lossless.
"""

from __future__ import annotations

import torch
from torch import nn


class MarkovHead(nn.Module):
    """A rank-R bigram bias over the vocabulary: `bias(embed(prev))` is (..., V)."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.zeros_(self.markov_w2.weight)

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        """(...,) token ids -> (..., R) their Markov embeddings."""
        return self.markov_w1(prev)

    def bias(self, embedded: torch.Tensor) -> torch.Tensor:
        """(..., R) Markov embeddings -> (..., V) float32 logit bias."""
        return self.markov_w2(embedded).float()


class ConfidenceHead(nn.Module):
    """The logit of a slot's confidence: proj([hidden ; Markov embedding of prev])."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """(..., D) hidden states and (..., R) Markov embeddings -> (...,) float32 logits."""
        inputs = torch.cat([hidden.to(self.proj.weight.dtype), embedded.to(self.proj.weight.dtype)], dim=-1)
        return self.proj(inputs).squeeze(-1).float()
