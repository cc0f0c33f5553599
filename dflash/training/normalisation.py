"""The training loss normalised over the global batch of an optimizer step.

Invariants (docs/design.md invariant 10):
- The gradient of an optimizer step is that of sum w l / W, the sum running over the
  weighted slots of every micro-batch on every rank of the step, W = sum w over the same
  slots: every supervised slot counts the same, whichever rank or micro-batch holds it.
  With one rank and no accumulation this is the batch's own ratio `BlockLoss.loss`.
- How, given that Lightning runs backward after each micro-batch, before the step's W is
  known: the step's first micro-batch sums its weight over the R ranks (one scalar
  all-reduce after its forward), W_1, and fixes c = R / W_1 for the whole step (R / 1 if
  W_1 = 0). Every micro-batch backpropagates c * sum w l; Lightning divides that by
  N = `accumulate_grad_batches` (always N, also in an epoch's last, shorter window) and
  DDP/FSDP average gradients over the R ranks, so the accumulated gradient is
  sum grad(sum w l) / (N W_1). With N > 1, `finish_step` (called before clipping and the
  optimizer) sums the step's weight over ranks, W, and multiplies the gradients by
  N W_1 / W. With N = 1 the factor is exactly 1 (W = W_1): no gradient is touched and no
  second all-reduce runs. A step whose W is 0 has zero gradients and is left as it is.
- The metrics (`dflash.training.metrics`) already divide sums over all micro-batches and
  ranks of their window, so the logged `train/loss` and `val/loss` are the same kind of
  global ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from dflash.training.loss import BlockLoss

SumOverRanks = Callable[[torch.Tensor], torch.Tensor]


class GlobalLossScale:
    """Per optimizer step: the scale of each micro-batch's backward value, and the gradient
    correction once the step's global weight is known (see the module invariants)."""

    def __init__(self):
        self._reference: torch.Tensor | None = None  # W_1 (float64 scalar), None before the step's first micro-batch
        self._local_weight: torch.Tensor | None = None  # this rank's sum w over the step so far

    def backward_value(self, result: BlockLoss, world_size: int, sum_over_ranks: SumOverRanks) -> torch.Tensor:
        """The scalar to backpropagate for one micro-batch: c * sum w l with c = R / W_1.

        sum_over_ranks: all-reduce (sum) of a scalar tensor over the R ranks (identity on one).
        """
        weight = result.weight
        if self._reference is None:
            first = sum_over_ranks(weight.clone())
            self._reference = torch.where(first > 0, first, torch.ones_like(first))
            self._local_weight = weight
        else:
            self._local_weight = self._local_weight + weight
        divisor = (self._reference / world_size).to(result.weighted_sum.dtype)
        return result.weighted_sum / divisor

    def finish_step(self, gradients: Iterable[torch.Tensor], accumulate: int, sum_over_ranks: SumOverRanks) -> None:
        """Close the step: with `accumulate` (N) > 1, multiply `gradients` in place by N W_1 / W.

        Called once per optimizer step after its last backward, before clipping, on every rank.
        """
        reference, local_weight = self._reference, self._local_weight
        self._reference = self._local_weight = None
        if reference is None or accumulate == 1:
            return
        total = sum_over_ranks(local_weight.clone())
        if total <= 0:
            return
        factor = accumulate * reference / total
        for gradient in gradients:
            gradient.mul_(factor.to(device=gradient.device, dtype=gradient.dtype))
