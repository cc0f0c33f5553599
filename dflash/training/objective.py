"""A trained method's side of the training module: its drafter and its loss.

`dflash.training.module.DrafterTrainingModule` is composed from one `Objective`; each
trained method builds its own (`Method.build_objective`, `dflash.methods`): DFlash's is
`dflash.dflash.objective`, EAGLE-3's `dflash.eagle3.objective`.

Invariants:
- `taps()` is fixed for the life of the objective: the disk cache is filled with those
  layers once, and every step reads them in that order.
- `loss` returns a `BlockLoss` whose slot count is `slots`, so every method's metrics are
  acc_01.. and tau_sim alike (`dflash.training.metrics`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from dflash.target import TargetModel
from dflash.training.loss import BlockLoss


class Objective(Protocol):
    """What `DrafterTrainingModule` calls.

    drafter: the trained `torch.nn.Module` (registered by the module as `drafter`).
    slots: positions scored per draft (DFlash: the block size; EAGLE-3: ttt_length + 1).
    """

    drafter: torch.nn.Module
    slots: int

    def taps(self) -> list[int]:
        """Target layers whose states `loss` reads (0-based; the final layer's output is
        taken after the final norm), in the order they are concatenated."""

    def loss(self, target: TargetModel, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        """The loss of `batch` given its target `states` (b, S, len(taps) * D) (None without taps).

        target: the frozen target, on the module's device; generator: RNG for any
        sampling; full_vocab: see `DrafterTrainingModule.compute_loss`.
        """

    def on_device(self, device: torch.device) -> None:
        """Called before every step with the module's device (e.g. to pick a kernel)."""

    def setup(self, target: TargetModel, datamodule) -> None:
        """Called once the trainer and its datamodule (None without one) exist, before a
        resumed checkpoint loads."""

    def checkpoint_config(self) -> dict:
        """The drafter's config.json dict, stored in every checkpoint."""
