"""The block loss: a per-slot objective through the frozen head, chunked over rows, and
position weights. Options and their sources: docs/training.md, "Loss options".

Invariants:
- Slot k of the block at anchor a is scored on the token at position a+k (docs/design.md invariant
  4); only the M valid slots get logits. The target's distribution for that token comes
  from the target's final (normed) hidden state at position a+k-1 of the same frozen
  forward that gives the features.
- Chunking: at most `chunk_rows` rows x vocabulary of logits (drafter's or target's) exist
  at once, in forward and in backward. A row's loss depends only on its own hidden state
  and the head is frozen, so each chunk's gradient w.r.t. its hidden rows is computed in
  the forward pass (as fused linear-cross-entropy kernels do) and kept, (M, D); backward
  scales it by the incoming per-row gradient. No logits are kept, none are recomputed,
  and the head gets no gradient.
- A batch's result carries the numerator sum_r w_r l_r (in the graph) and the weights w
  (detached) separately; its `loss` is their ratio, sum_r w_r l_r / sum_r w_r over the
  batch's valid slots. Training does not backpropagate that ratio: it divides the
  numerator by the weight of the whole optimizer step over all ranks and micro-batches
  (docs/design.md invariant 10, `dflash.training.normalisation`).
- `top_k` > 0 also returns each row's top-k head logits and their ids (detached, from the same
  logits the loss reads): DFlash2's selector takes its candidates from them, so the head is read
  once.
- Metrics read the blocks' labels under every objective: `correct` is drafter argmax ==
  label, `cross_entropy` the cross-entropy to the label. The labels are the data tokens
  unless the agreement mask made them the target's greedy tokens (invariant 26).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from dflash.training.blocks import Blocks

# Published gamma per block size (DFlash paper): 7 / 5 / 4 for B = 16 / 10 / 8.
PUBLISHED_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def default_gamma(block_size: int) -> float:
    """Gamma for block size B: the published value for B in {8, 10, 16}; otherwise the
    piecewise-linear curve through those points, extended with its nearest segment's
    slope and floored at 1 (B=4 -> 2.0, B=12 -> 5.67, B=32 -> 12.33)."""
    if block_size in PUBLISHED_GAMMA:
        return PUBLISHED_GAMMA[block_size]
    points = sorted(PUBLISHED_GAMMA.items())
    segments = list(zip(points, points[1:]))
    (b0, g0), (b1, g1) = next((s for s in segments if block_size <= s[1][0]), segments[-1])
    return max(1.0, g0 + (g1 - g0) * (block_size - b0) / (b1 - b0))


def resolve_gamma(loss_gamma: float | str, block_size: int) -> float:
    """The config value `training.loss_gamma` ("auto" or a number) as a number."""
    return default_gamma(block_size) if loss_gamma == "auto" else float(loss_gamma)


def position_weights(block_size: int, gamma: float | None) -> torch.Tensor:
    """(B,) float weights per slot: 0 for slot 0, exp(-(k-1)/gamma) for k >= 1 (1 if gamma is None)."""
    slot = torch.arange(block_size, dtype=torch.float64)
    weights = torch.ones(block_size, dtype=torch.float64) if gamma is None else torch.exp(-(slot - 1) / gamma)
    weights[0] = 0.0
    return weights.float()


def dpace_weights(slot_losses: torch.Tensor, flat_index: torch.Tensor, num_blocks: int, block_size: int, alpha: float):
    """D-PACE weights (arXiv 2605.18810; the authors' code, Lucas-TY/D-PACE) of M valid slots.

    Per block, with q_k = exp(-l_k) the drafter's probability of slot k's label and
    s_k = (1 - alpha) q_k + alpha on valid slots (1 elsewhere, slot 0 included):
    P_k = prod_{i<=k} s_i and w_k = sum_{j>=k, j valid} P_j. Detached.

    Args:
        slot_losses: (M,) per-slot loss l.
        flat_index: (M,) index of each slot in the flattened (num_blocks * B) layout.
    Returns:
        (M,) float32 weights.
    """
    with torch.no_grad():
        smoothed = torch.ones(num_blocks * block_size, dtype=torch.float64, device=slot_losses.device)
        smoothed[flat_index] = (1.0 - alpha) * torch.exp(-slot_losses.double()) + alpha
        prefix = smoothed.view(num_blocks, block_size).cumprod(dim=-1).view(-1)
        valid_prefix = torch.zeros_like(prefix)
        valid_prefix[flat_index] = prefix[flat_index]
        suffix = valid_prefix.view(num_blocks, block_size).flip(-1).cumsum(-1).flip(-1).view(-1)
        return suffix[flat_index].float()


@dataclass(frozen=True)
class LossSettings:
    """How `block_loss` scores a batch. block_size: B; objective, position_weights, gamma,
    dpace_alpha, chunk_rows: as `TrainingSettings`' loss, position_weights, loss_gamma (a number),
    dpace_alpha and loss_chunk_rows (None: all rows at once, the dense reference path, which
    keeps M x V logits for backward)."""

    block_size: int
    objective: str = "ce"
    position_weights: str = "gamma"
    gamma: float = 7.0
    dpace_alpha: float = 0.5
    chunk_rows: int | None = 256

    @property
    def reads_target(self) -> bool:
        """Whether the objective needs the target's final hidden states."""
        return self.objective != "ce"

    def static_weights(self) -> torch.Tensor | None:
        """(B,) per-slot weights for "gamma" and "uniform"; None for "dpace" (per batch)."""
        if self.position_weights == "dpace":
            return None
        return position_weights(self.block_size, self.gamma if self.position_weights == "gamma" else None)


@dataclass
class BlockLoss:
    """Loss of one batch and what the metrics need, per valid slot (M of them).

    weighted_sum: scalar, sum_k w_k * l_k over valid slots, in the graph (0, still in the
    graph, if M = 0). slots: (M,) slot index k; correct: (M,) bool argmax == data token;
    cross_entropy: (M,) float cross-entropy to the data token; weights: (M,) float, detached.
    top_logits, top_ids: (M, top_k) the head's largest logits, best first, and their token ids,
    when `block_loss` was asked for them (top_k > 0), else None.
    """

    weighted_sum: torch.Tensor
    slots: torch.Tensor
    correct: torch.Tensor
    cross_entropy: torch.Tensor
    weights: torch.Tensor
    top_logits: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None

    @property
    def loss(self) -> torch.Tensor:
        """Scalar: this batch's own ratio sum w l / sum w (0 when no slot is weighted)."""
        return self.weighted_sum / self.weights.sum().clamp_min(math.ulp(1.0))

    @property
    def weight(self) -> torch.Tensor:
        """Scalar float64: sum w of this batch, detached (the denominator of `loss`)."""
        return self.weights.detach().double().sum()


def _row_terms(rows, to_logits, labels, target_rows, objective, top_k):
    """Per-row (loss, data cross-entropy, correct, top-k logits, their ids) of rows (n, D) through
    the head; the loss is differentiable w.r.t. `rows` when grad is enabled."""
    logits = to_logits(rows).float()
    none = logits.new_zeros(rows.shape[0], 0)  # (n, 0): top_k 0 costs no pass over the logits
    top = logits.detach().topk(top_k, dim=-1) if top_k else (none, none.long())
    log_probs = logits.log_softmax(dim=-1)
    data_ce = -log_probs.gather(1, labels[:, None]).squeeze(1)
    correct = log_probs.detach().argmax(dim=-1) == labels
    if objective == "ce":
        return data_ce, data_ce.detach(), correct, *top
    with torch.no_grad():
        target_log_probs = to_logits(target_rows).float().log_softmax(dim=-1)
    if objective == "ce_target_argmax":
        loss = -log_probs.gather(1, target_log_probs.argmax(dim=-1, keepdim=True)).squeeze(1)
    else:  # kl: sum_v p_target (log p_target - log p_drafter)
        loss = (target_log_probs.exp() * (target_log_probs - log_probs)).sum(dim=-1)
    return loss, data_ce.detach(), correct, *top


class _ChunkedHeadLoss(torch.autograd.Function):
    """Per-row losses of `rows` (M, D), `chunk_rows` rows of logits at a time (see the
    module invariants). Outputs: loss (M,) differentiable; data cross-entropy (M,), correct (M,),
    top-k logits and ids (M, k)."""

    @staticmethod
    def forward(ctx, rows, to_logits, labels, target_rows, objective, chunk_rows, top_k):
        need_grad = ctx.needs_input_grad[0]
        losses, grads, outputs = [], [], []
        for start in range(0, max(rows.shape[0], 1), chunk_rows):  # one empty chunk when M = 0
            chunk = slice(start, start + chunk_rows)
            target_chunk = None if target_rows is None else target_rows[chunk]
            with torch.enable_grad() if need_grad else nullcontext():
                chunk_hidden = rows[chunk].detach().requires_grad_(need_grad)
                loss, *rest = _row_terms(chunk_hidden, to_logits, labels[chunk], target_chunk, objective, top_k)
                if need_grad:
                    (grad,) = torch.autograd.grad(loss.sum(), chunk_hidden)
                    grads.append(grad)
            losses.append(loss.detach())
            outputs.append(rest)
        if need_grad:
            ctx.save_for_backward(torch.cat(grads))
        rest = [torch.cat(column) for column in zip(*outputs)]
        ctx.mark_non_differentiable(*rest)
        return torch.cat(losses), *rest

    @staticmethod
    def backward(ctx, grad_loss, *_non_differentiable):
        (row_grads,) = ctx.saved_tensors
        return grad_loss.to(row_grads.dtype)[:, None] * row_grads, None, None, None, None, None, None


def block_loss(
    hidden: torch.Tensor,
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    blocks: Blocks,
    settings: LossSettings,
    target_hidden: torch.Tensor | None = None,
    vocab_lookup: torch.Tensor | None = None,
    top_k: int = 0,
) -> BlockLoss:
    """Weighted per-slot loss of the drafter's block predictions.

    Args:
        hidden: (b, N*B, D) drafter hidden states of the blocks.
        to_logits: the target's frozen head transform, (n, D) -> (n, V) (`TargetModel.logits`).
        blocks: labels/label_valid/positions of shape (b, N*B), slots (N*B,).
        settings: objective, position weights, chunking.
        target_hidden: (b, S, D) the target's final normed hidden states; needed when
            `settings.reads_target`.
        vocab_lookup: (V,) with a training vocabulary (`dflash.training.draft_vocab`): each
            token's index among the K logits `to_logits` returns, -1 outside; slots whose
            label is outside are not scored.
        top_k: how many of each valid row's largest logits `BlockLoss.top_logits` carries.
    """
    valid = blocks.label_valid
    if vocab_lookup is not None:
        valid = valid & (vocab_lookup[blocks.labels] >= 0)
    batch, queries = valid.shape
    block_size = settings.block_size
    rows = hidden[valid]
    labels = blocks.labels[valid]
    if vocab_lookup is not None:
        labels = vocab_lookup[labels]
    slots = blocks.slots.expand_as(valid)[valid]
    target_rows = None
    if settings.reads_target:
        if target_hidden is None:
            raise ValueError(f"loss {settings.objective!r} needs the target's final hidden states")
        batch_index = torch.arange(batch, device=valid.device)[:, None].expand_as(valid)[valid]
        target_rows = target_hidden[batch_index, blocks.positions[valid] - 1]  # predicts position a+k
    if settings.chunk_rows is None:
        terms = _row_terms(rows, to_logits, labels, target_rows, settings.objective, top_k)
    else:
        terms = _ChunkedHeadLoss.apply(rows, to_logits, labels, target_rows, settings.objective, settings.chunk_rows, top_k)
    slot_losses, cross_entropy, correct, top_logits, top_ids = terms
    static = settings.static_weights()
    if static is None:
        flat_index = valid.view(-1).nonzero().squeeze(1)
        weights = dpace_weights(slot_losses.detach(), flat_index, batch * queries // block_size, block_size, settings.dpace_alpha)
    else:
        weights = static.to(hidden.device)[slots]
    weighted_sum = (weights * slot_losses).sum()
    top = (top_logits, top_ids) if top_k else (None, None)
    return BlockLoss(weighted_sum, slots, correct, cross_entropy, weights, *top)
