"""DSpark's heads (arXiv 2607.05147; llama.cpp build 11434 src/models/dflash.cpp:296-407) and
DFlash2's convolution and candidate selector (dflash.cpp:409-565).

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

DFlash2 (docs/frontier.md 1.2; tensor_mapping.py:1491-1517, qwen.py:915-919):
- Names: `layers.{i}.attention_conv` / `layers.{i}.mlp_conv` hold `base_kernel` (2, K, D), a bare
  parameter, and `kernel_projection.weight` (2·K·D/g, D); `candidate_selector` holds
  `predecessor_codebook` and `successor_codebook` (V, R), bare parameters, and
  `hidden_projection.weight` (R, D).
- The convolution runs over the rows of one block of B rows (rows j·B .. j·B + B - 1 of the
  query axis): row r reads rows r - t of its own block only, zero before the block's first row
  (dflash.cpp:451-470); context rows are never convolved. Its coefficient for channel c, tap t,
  side s is `base_kernel[s, t, c] + projection[s·K·G + t·G + c // g]` (dflash.cpp:436-446).
  Identity-initialised (tap 0 = 1, projection zero): a new drafter computes the DFlash one.
- The selector's score of candidate k after predecessor j is
  `unary[k] + Σ_r successor[cand_k, r] · predecessor[pred_j, r] · gate[r]`, gate = hidden_projection(h)
  (dflash.cpp:497-536). The successor codebook starts at zero: scores start equal to the unary
  logits, and both codebooks still get gradients.
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


class GroupedDynamicConv(nn.Module):
    """DFlash2's two-sided block-local convolution of one sub-layer (attention or MLP).

    `pre(x, B)` convolves the sub-layer's input with side 0 and returns the per-row coefficients
    it computed from `x`; `post(y, coefficients, B)` convolves the sub-layer's output with side 1.
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.num_groups = hidden_size // group_size
        base = torch.zeros(2, kernel_size, hidden_size)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.num_groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def pre(self, x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, q, D) sub-layer input -> its side-0 convolution and the (b, q, 2·K·G) coefficients."""
        coefficients = self.kernel_projection(x)
        return self.convolve(x, coefficients, 0, block_size), coefficients

    def post(self, y: torch.Tensor, coefficients: torch.Tensor, block_size: int) -> torch.Tensor:
        """(b, q, D) sub-layer output -> its side-1 convolution with the coefficients of `pre`."""
        return self.convolve(y, coefficients, 1, block_size)

    def convolve(self, x: torch.Tensor, coefficients: torch.Tensor, side: int, block_size: int) -> torch.Tensor:
        batch, rows, hidden = x.shape
        k, g = self.kernel_size, self.num_groups
        dynamic = coefficients.view(batch, rows, 2, k, g)[:, :, side]  # (b, q, K, G)
        weights = dynamic.repeat_interleave(self.group_size, dim=-1) + self.base_kernel[side].to(x.dtype)
        slot = torch.arange(rows, device=x.device) % block_size  # the row's index inside its block
        out = weights[:, :, 0] * x
        for tap in range(1, min(k, block_size)):
            earlier = torch.cat([x.new_zeros(batch, tap, hidden), x[:, :-tap]], dim=1)
            earlier = earlier * (slot >= tap).to(x.dtype).unsqueeze(-1)  # zero before the block's first row
            out = out + weights[:, :, tap] * earlier
        return out


class CandidateSelector(nn.Module):
    """DFlash2's top-k path selector: rank-R transition scores between a slot's candidates and
    its predecessors, added to the candidates' unary logits."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        nn.init.normal_(self.predecessor_codebook, std=0.02)
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=0.02)

    def scores(
        self, candidates: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor, predecessors: torch.Tensor
    ) -> torch.Tensor:
        """Float32 scores (..., J, K) of the K `candidates` (..., K) with unary logits (..., K) of a
        slot with final-normed `hidden` (..., D) after each of its J `predecessors` (..., J)."""
        gate = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype)).float()  # (..., R)
        successor = self.successor_codebook[candidates].float()  # (..., K, R)
        predecessor = self.predecessor_codebook[predecessors].float() * gate.unsqueeze(-2)  # (..., J, R)
        return unary.float().unsqueeze(-2) + predecessor @ successor.transpose(-1, -2)
