"""Per-position accuracy and simulated acceptance length, summed before divided.

Invariant (docs/design.md invariant 11): correct counts, slot counts and weighted losses are
accumulated as sums over batches and (through torchmetrics' "sum" reduction) over
ranks; divisions happen only in `compute`.

acc_k = correct_k / total_k for slot k = 1..B-1, and
tau_sim = 1 + sum_k prod_{i<=k} acc_i: the acceptance length (bonus token counted)
that a drafter with independent per-slot errors would reach.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

from dflash.training.loss import BlockLoss


def simulated_acceptance_length(accuracies: torch.Tensor) -> torch.Tensor:
    """tau_sim = 1 + sum_k prod_{i<=k} acc_i for accuracies (B-1,) of slots 1..B-1."""
    return 1.0 + torch.cumprod(accuracies, dim=0).sum()


class BlockMetrics(Metric):
    """Accumulates `BlockLoss` results; `compute()` returns {"loss", "acc_01".., "tau_sim"}.

    Keys name slot k with two digits (acc_01 .. acc_15) so dashboards sort them.
    A slot that saw no target yet has accuracy 0.
    """

    full_state_update = False

    def __init__(self, block_size: int):
        super().__init__()
        self.block_size = block_size
        self.add_state("correct", default=torch.zeros(block_size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros(block_size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weighted_loss", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, result: BlockLoss) -> None:
        slots = result.slots.to(self.correct.device)
        self.correct.index_add_(0, slots, result.correct.to(self.correct))
        self.total.index_add_(0, slots, torch.ones_like(slots, dtype=self.total.dtype))
        weights = result.weights.detach().to(self.weight)
        self.weighted_loss += (weights * result.cross_entropy.to(self.weight)).sum()
        self.weight += weights.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        accuracies = (self.correct / self.total.clamp_min(1))[1:]
        out = {"loss": (self.weighted_loss / self.weight.clamp_min(1e-12)).float()}
        for k, accuracy in enumerate(accuracies.float(), start=1):
            out[f"acc_{k:02d}"] = accuracy
        out["tau_sim"] = simulated_acceptance_length(accuracies).float()
        return out
