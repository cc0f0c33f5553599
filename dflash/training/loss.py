"""The position-weighted block loss.

Cross-entropy on the valid slots k >= 1, weighted by w_k = exp(-(k-1)/gamma) (early
slots matter most: a draft is accepted only up to its first miss) and normalised by the
summed weight of the valid slots. Logits are computed for valid slots only, since the
vocabulary can be 150k wide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

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


def resolve_gamma(loss_gamma: float | str | None, block_size: int) -> float | None:
    """The config value `training.loss_gamma` ("auto", None or a number) as a number or None."""
    return default_gamma(block_size) if loss_gamma == "auto" else loss_gamma


def position_weights(block_size: int, gamma: float | None) -> torch.Tensor:
    """(B,) float weights per slot: 0 for slot 0, exp(-(k-1)/gamma) for k >= 1 (1 if gamma is None)."""
    slot = torch.arange(block_size, dtype=torch.float64)
    weights = torch.ones(block_size, dtype=torch.float64) if gamma is None else torch.exp(-(slot - 1) / gamma)
    weights[0] = 0.0
    return weights.float()


@dataclass
class BlockLoss:
    """Loss of one batch and what the metrics need, per valid slot (M of them).

    loss: scalar, sum_k w_k * ce / sum w_k over valid slots (0, still in the graph, if M = 0).
    slots: (M,) slot index k; correct: (M,) bool argmax == label; cross_entropy: (M,) float;
    weights: (M,) float.
    """

    loss: torch.Tensor
    slots: torch.Tensor
    correct: torch.Tensor
    cross_entropy: torch.Tensor
    weights: torch.Tensor


def block_loss(
    hidden: torch.Tensor, to_logits: Callable[[torch.Tensor], torch.Tensor], blocks: Blocks, slot_weights: torch.Tensor
) -> BlockLoss:
    """Weighted cross-entropy of the drafter's block predictions.

    Args:
        hidden: (b, N*B, D) drafter hidden states of the blocks.
        to_logits: the target's frozen head transform, (n, D) -> (n, V) (`TargetModel.logits`).
        blocks: labels/label_valid/slots of shape (b, N*B) / (N*B,).
        slot_weights: (B,) from `position_weights`.
    """
    valid = blocks.label_valid
    rows = hidden[valid]
    logits = to_logits(rows).float()
    labels = blocks.labels[valid]
    slots = blocks.slots.expand_as(valid)[valid]
    weights = slot_weights.to(hidden.device)[slots]
    cross_entropy = F.cross_entropy(logits, labels, reduction="none")
    loss = (weights * cross_entropy).sum() / weights.sum().clamp_min(math.ulp(1.0))
    correct = logits.detach().argmax(dim=-1) == labels
    return BlockLoss(loss=loss, slots=slots, correct=correct, cross_entropy=cross_entropy.detach(), weights=weights)
