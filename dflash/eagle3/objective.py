"""EAGLE-3's side of the training module (`method=eagle3`): its drafter and the
training-time-test loss, as a `dflash.training.objective.Objective`.

Same frozen target (outside the optimizer and checkpoints), optimizer, schedule, metrics
and logging as DFlash; the checkpoint stores the drafter's config.json dict like DFlash's
(its `architectures` tells `python -m dflash.export` which method wrote it).
"""

from __future__ import annotations

import torch

from dflash.eagle3.config import Eagle3Config
from dflash.eagle3.model import Eagle3Drafter
from dflash.eagle3.training import draft_vocab_from_counts, ttt_loss
from dflash.target import TargetModel
from dflash.training.loss import BlockLoss


def build_eagle3_drafter(target: TargetModel, settings) -> Eagle3Drafter:
    """A new drafter for `target`, lm_head initialised from the target's.

    settings: the `method` group of `method=eagle3` (`dflash.methods.eagle3.Eagle3TrainSettings`).
    """
    config = Eagle3Config.from_target(
        target.config, settings.target_layer_ids, settings.draft_vocab_size, settings.intermediate_size
    )
    torch.manual_seed(0 if settings.seed is None else settings.seed)
    drafter = Eagle3Drafter(config).to(target.device)
    drafter.lm_head.weight.data.copy_(target.lm_head.weight[: config.draft_vocab_size].float())
    return drafter


class Eagle3Objective:
    """Trains an `Eagle3Drafter` with the training-time test (`dflash.eagle3.training`)."""

    def __init__(self, target: TargetModel, settings):
        self.settings = settings
        self.drafter = build_eagle3_drafter(target, settings)
        self.slots = settings.ttt_length + 1

    def taps(self) -> list[int]:
        return list(self.drafter.config.target_layer_ids)

    def on_device(self, device: torch.device) -> None:
        pass

    def checkpoint_config(self) -> dict:
        return self.drafter.config.to_hf_dict()

    def setup(self, target: TargetModel, datamodule) -> None:
        # Before a resumed checkpoint restores its own d2t/t2d. The loader is not yet sharded
        # by rank, so every DDP rank counts the whole training split and picks the same vocabulary.
        if self.settings.draft_vocab_size is None or datamodule is None:
            return
        counts = torch.zeros(self.drafter.config.vocab_size, dtype=torch.long)
        for batch in datamodule.train_dataloader():
            tokens = batch["input_ids"][batch["loss_mask"].bool() & batch["attention_mask"].bool()]
            counts += torch.bincount(tokens, minlength=counts.numel())[: counts.numel()]
        ids = draft_vocab_from_counts(counts, self.drafter.config.draft_vocab_size)
        self.drafter.set_draft_vocab(ids)
        self.drafter.lm_head.weight.data.copy_(target.lm_head.weight[ids.to(target.device)].float())

    def loss(self, target: TargetModel, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        """TTT loss of right-padded `input_ids` / `loss_mask` / `attention_mask` (b, S);
        `full_vocab` is DFlash's (EAGLE-3 scores its own draft vocabulary either way)."""
        loss_mask = batch["loss_mask"].bool() & batch["attention_mask"].bool()
        ttt_length, decay = self.settings.ttt_length, self.settings.step_weight_decay
        return ttt_loss(self.drafter, target.embed, states, batch["input_ids"], loss_mask, ttt_length, decay)
