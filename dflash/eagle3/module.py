"""The LightningModule that trains an EAGLE-3 drafter (`method=eagle3`).

It is `DFlashTrainingModule` with another drafter and loss: the same frozen target
(outside the optimizer and checkpoints), optimizer, schedule, metrics and logging. The
checkpoint stores the drafter's config.json dict under `DRAFTER_CONFIG_KEY` like DFlash's
(its `architectures` tells the exporter which kind it is).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import lightning as L
import torch

from dflash.eagle3.config import Eagle3Config
from dflash.eagle3.model import Eagle3Drafter
from dflash.eagle3.training import draft_vocab_from_counts, ttt_loss
from dflash.errors import require
from dflash.specs import TargetSpec, load_target
from dflash.training.config import TrainingConfig
from dflash.training.loss import BlockLoss
from dflash.training.metrics import BlockMetrics
from dflash.training.module import DRAFTER_CONFIG_KEY, DFlashTrainingModule


@dataclass
class Eagle3Settings:
    """The `method` config group for `method=eagle3` (dflash/conf/method/eagle3.yaml).

    ttt_length: training-time-test steps (published: 7). step_weight_decay: loss weight
    of step j is decay^j (published: 0.8). draft_vocab_size: None = the full target
    vocabulary, else the most frequent response tokens of the training data.
    target_layer_ids: three target layers (None: [1, L//2-1, L-4]).
    intermediate_size: MLP width (None: the target's). seed: initialisation (None: the run's seed).
    """

    name: str = "eagle3"
    ttt_length: int = 7
    step_weight_decay: float = 0.8
    draft_vocab_size: int | None = None
    target_layer_ids: list[int] | None = None
    intermediate_size: int | None = None
    seed: int | None = None

    def __post_init__(self):
        require(self.ttt_length >= 1, "method.ttt_length", f"must be >= 1, got {self.ttt_length}")
        require(0 < self.step_weight_decay <= 1, "method.step_weight_decay", f"must be in (0, 1], got {self.step_weight_decay}")


def build_eagle3_drafter(target, settings: Eagle3Settings) -> Eagle3Drafter:
    """A new drafter for `target` (a `TargetModel`), lm_head initialised from the target's."""
    config = Eagle3Config.from_target(target.config, settings.target_layer_ids, settings.draft_vocab_size, settings.intermediate_size)
    torch.manual_seed(0 if settings.seed is None else settings.seed)
    drafter = Eagle3Drafter(config).to(target.device)
    drafter.lm_head.weight.data.copy_(target.lm_head.weight[: config.draft_vocab_size].float())
    return drafter


class Eagle3TrainingModule(DFlashTrainingModule):
    """Trains `self.drafter` (an `Eagle3Drafter`) with the training-time test."""

    def __init__(self, target: TargetSpec, settings: Eagle3Settings, training: TrainingConfig):
        L.LightningModule.__init__(self)  # DFlashTrainingModule.__init__ builds a DFlash drafter
        self.save_hyperparameters(
            {"target": dataclasses.asdict(target), "method": dataclasses.asdict(settings), "training": dataclasses.asdict(training)}
        )
        self.training_config = training
        self.settings = settings
        self.target = load_target(target)
        self.drafter = build_eagle3_drafter(self.target, settings)
        self.train_metrics = BlockMetrics(settings.ttt_length + 1)
        self.val_metrics = BlockMetrics(settings.ttt_length + 1)
        self._last_logged_step = -1
        self.state_cache = None  # the in-memory cache is DFlash's; EAGLE-3 reads the disk cache
        self.disk_cache = None

    def cached_layers(self) -> list[int]:
        return list(self.drafter.config.target_layer_ids)

    def setup(self, stage: str) -> None:
        self.setup_disk_cache()
        # Runs before a resumed checkpoint is restored, which then brings its own d2t/t2d.
        # The datamodule's own loader is not yet sharded by rank, so every DDP rank counts
        # the whole training split and picks the same vocabulary.
        if self.settings.draft_vocab_size is None or self.trainer is None or self.trainer.datamodule is None:
            return
        counts = torch.zeros(self.drafter.config.vocab_size, dtype=torch.long)
        for batch in self.trainer.datamodule.train_dataloader():
            tokens = batch["input_ids"][batch["loss_mask"].bool() & batch["attention_mask"].bool()]
            counts += torch.bincount(tokens, minlength=counts.numel())[: counts.numel()]
        ids = draft_vocab_from_counts(counts, self.drafter.config.draft_vocab_size)
        self.drafter.set_draft_vocab(ids)
        self.drafter.lm_head.weight.data.copy_(self.target.lm_head.weight[ids.to(self.target.device)].float())

    def _prepare_device(self) -> None:
        if self.target.device != self.device:
            self.target.model.to(self.device)

    def compute_loss(self, batch: dict, generator: torch.Generator | None = None, full_vocab: bool = True) -> BlockLoss:
        """TTT loss of right-padded `input_ids` / `loss_mask` / `attention_mask` (b, S);
        `full_vocab` is DFlash's (EAGLE-3 scores its own draft vocabulary either way)."""
        self._prepare_device()
        input_ids = batch["input_ids"]
        loss_mask = batch["loss_mask"].bool() & batch["attention_mask"].bool()
        features = self._states(batch, batch["attention_mask"].bool(), self.cached_layers())
        return ttt_loss(
            self.drafter, self.target.embed, features, input_ids, loss_mask, self.settings.ttt_length, self.settings.step_weight_decay
        )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[DRAFTER_CONFIG_KEY] = self.drafter.config.to_hf_dict()
