"""A trained method's side of the training module: its drafter and its loss.

`dflash.training.module.DrafterTrainingModule` is composed from one `Objective`; each
trained method (`dflash.methods`) builds its own. This module holds the interface and
DFlash's objective (random anchors, blocks under the sparse mask, position-weighted loss;
`dflash.training.anchors` .. `dflash.training.loss`); EAGLE-3's is `dflash.eagle3.objective`.

Invariants:
- `taps()` is fixed for the life of the objective: the disk cache is filled with those
  layers once, and every step reads them in that order.
- `loss` returns a `BlockLoss` whose slot count is `slots`, so every method's metrics are
  acc_01.. and tau_sim alike (`dflash.training.metrics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dflash.errors import require
from dflash.specs import DrafterSpec, TargetSpec, build_drafter
from dflash.target import TargetModel
from dflash.training.anchors import sample_anchors
from dflash.training.blocks import build_blocks
from dflash.training.config import TrainingConfig
from dflash.training.draft_vocab import DraftVocab, frequent_response_tokens
from dflash.training.forward import draft_blocks, set_attention_implementation, training_attention_implementation
from dflash.training.loss import BlockLoss, LossSettings, block_loss, resolve_gamma

BLOCK_SIZE_MESSAGE = "must be >= 2 for training (slot 0 is the anchor; at least one masked slot), got {}"


@dataclass(frozen=True)
class TrainedMethod:
    """What training needs from a trained method (`dflash.methods` entries carry one).

    check(settings, drafter, data, training): checks before any model loads
        (`DrafterSpec`, `DataSpec`, `TrainingConfig`); ConfigError naming the key.
    module(target, settings, drafter, training): the `DrafterTrainingModule` to fit.
    export(checkpoint, out_dir, dtype): write the drafter directory of a checkpoint this
        method's module saved (the dict `dflash.training.export.read_checkpoint` returns;
        read once by the caller), without the target; returns out_dir.
    architectures: the `architectures` its checkpoints' drafter config carries (how
        `python -m dflash.export` tells which method wrote a checkpoint).
    evaluation(drafter_dir, settings): (method name, its evaluation settings or None) that
        evaluates the exported drafter after training.
    The schema of its `method` group is the registry's `Method.train_settings`.
    """

    check: Callable[[Any, DrafterSpec, Any, TrainingConfig], None]
    module: Callable[[TargetSpec, Any, DrafterSpec, TrainingConfig], Any]
    export: Callable[[dict, str, Any], str]
    architectures: tuple[str, ...]
    evaluation: Callable[[str, Any], tuple[str, Any]]


class Objective:
    """The interface `DrafterTrainingModule` calls; subclasses fill it in.

    drafter: the trained `torch.nn.Module` (registered by the module as `drafter`).
    slots: positions scored per draft (DFlash: the block size; EAGLE-3: ttt_length + 1).
    """

    drafter: torch.nn.Module
    slots: int

    def taps(self) -> list[int]:
        """Target layers whose states `loss` reads (0-based; the final layer's output is
        taken after the final norm), in the order they are concatenated."""
        raise NotImplementedError

    def loss(self, module, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        """The loss of `batch` given its target `states` (b, S, len(taps) * D) (None without taps).

        module: the `DrafterTrainingModule` (its `target`, `device`, `training_config`,
        `training_rows()`); generator: RNG for any sampling; full_vocab: see `compute_loss`.
        """
        raise NotImplementedError

    def on_device(self, device: torch.device) -> None:
        """Called before every step with the module's device (e.g. to pick a kernel)."""

    def setup(self, module) -> None:
        """Called once the trainer and its datamodule exist (before a resumed checkpoint loads)."""

    def checkpoint_config(self) -> dict:
        """The drafter's config.json dict, stored in every checkpoint."""
        return self.drafter.config.to_hf_dict()


class DFlashObjective(Objective):
    """DFlash: blocks at random anchors in the response, drafted in one pass, scored by
    the position-weighted loss over the target's LM head."""

    def __init__(self, target: TargetModel, drafter: DrafterSpec, training: TrainingConfig):
        if drafter.path is None:
            require(drafter.block_size >= 2, "drafter.block_size", BLOCK_SIZE_MESSAGE.format(drafter.block_size))
        self.training = training
        self.drafter = build_drafter(drafter, target)
        block_size = self.drafter.block_size
        require(block_size >= 2, "drafter.block_size", BLOCK_SIZE_MESSAGE.format(block_size))
        self.slots = block_size
        self.loss_settings = LossSettings(
            block_size=block_size,
            objective=training.loss,
            position_weights=training.position_weights,
            gamma=resolve_gamma(training.loss_gamma, block_size),
            dpace_alpha=training.dpace_alpha,
            chunk_rows=training.loss_chunk_rows,
        )
        self.num_target_layers = target.num_layers
        self.hidden_size = target.hidden_size
        self.draft_vocab: DraftVocab | None = None  # counted on the first training step

    def feature_layers(self) -> list[int]:
        config = self.drafter.config
        return list(config.target_layer_ids) if config.use_target_features else []

    def taps(self) -> list[int]:
        """The drafter's taps, plus the final hidden states for losses that read the target's
        logits: HF's last hidden state ("layer L-1" here) is taken after the final norm, so
        target.logits() of it are the target's own logits (tests/training/test_losses.py)."""
        layers = self.feature_layers()
        return [*layers, self.num_target_layers - 1] if self.loss_settings.reads_target else layers

    def on_device(self, device: torch.device) -> None:
        implementation = training_attention_implementation(self.training.attention, device)
        if self.drafter.config.attn_implementation != implementation:
            set_attention_implementation(self.drafter, implementation)

    def loss(self, module, batch: dict, states: torch.Tensor | None, generator, full_vocab: bool) -> BlockLoss:
        target = module.target
        input_ids = batch["input_ids"]
        attention_mask = batch["attention_mask"].bool()
        loss_mask = batch["loss_mask"].bool() & attention_mask
        config = self.drafter.config
        split = len(self.feature_layers()) * self.hidden_size
        features = states[..., :split] if states is not None and split else None
        final_hidden = states[..., split:] if states is not None and self.loss_settings.reads_target else None
        if not config.use_target_features:  # standalone-drafter ablation: the context is the prefix's own token embeddings
            features = target.embed(input_ids)
        anchors = sample_anchors(loss_mask, config.block_size, self.training.num_anchors, self.training.anchor_sampling, generator)
        blocks = build_blocks(input_ids, loss_mask, anchors, config.block_size, config.mask_token_id)
        hidden = draft_blocks(self.drafter, target.embed, features, attention_mask, anchors, blocks)
        vocab = None if full_vocab else self.training_vocab(module)
        if vocab is None:
            return block_loss(hidden, target.logits, blocks, self.loss_settings, final_hidden)
        to_logits = lambda rows: target.logits(rows, head_rows=vocab.head_rows)  # noqa: E731
        return block_loss(hidden, to_logits, blocks, self.loss_settings, final_hidden, vocab.lookup)

    def training_vocab(self, module) -> DraftVocab | None:
        """The training vocabulary (`training.draft_vocab_size`) on the module's device, or None."""
        size = self.training.draft_vocab_size
        target = module.target
        if size is None or size >= target.embedding_rows:
            return None
        if self.draft_vocab is None:
            rows, train_set = module.training_rows()
            require(
                rows is not None and train_set is not None,
                "training.draft_vocab_size",
                "counts the training rows of a DFlashDataModule; train through python -m dflash.train or pass one",
            )
            ids = frequent_response_tokens(
                rows.input_ids, rows.loss_mask, rows.offsets, train_set.indices, size, target.embedding_rows
            )
            self.draft_vocab = DraftVocab.build(ids, target.head_rows_of(ids), target.embedding_rows)
        if self.draft_vocab.ids.device != module.device:
            self.draft_vocab = self.draft_vocab.to(module.device)
        return self.draft_vocab


def dflash_training_module(target: TargetSpec, drafter: DrafterSpec, training: TrainingConfig):
    """A `DrafterTrainingModule` training a DFlash drafter (`drafter.*`) against `target`."""
    from dflash.training.module import DrafterTrainingModule

    hparams = {
        "target": dataclasses.asdict(target),
        "drafter": dataclasses.asdict(drafter),
        "training": dataclasses.asdict(training),
    }
    return DrafterTrainingModule(target, lambda model: DFlashObjective(model, drafter, training), training, hparams)


def check_dflash_job(settings, drafter: DrafterSpec, data, training: TrainingConfig) -> None:
    """The drafter's block fits the data before any model loads; a drafter directory is
    read now, so a damaged or mismatched one fails before the target loads."""
    from dflash.drafter.io import check_drafter_dir
    from dflash.training.config import check_block_fits

    if drafter.path is None:
        require(drafter.block_size >= 2, "drafter.block_size", BLOCK_SIZE_MESSAGE.format(drafter.block_size))
        block_size = drafter.block_size
    else:
        block_size = check_drafter_dir(drafter.path).block_size
    check_block_fits(block_size, data.max_length, training.num_anchors)


def export_dflash_checkpoint(checkpoint: dict, out_dir: str, dtype=None) -> str:
    from dflash.training.export import export_state

    return export_state(checkpoint, out_dir, dtype=dtype)


def dflash_trained_method() -> TrainedMethod:
    """DFlash's training parts (its `method` group, `dflash.methods.dflash.DFlashTrainSettings`,
    holds nothing DFlash reads: the `drafter` and `training` groups configure it)."""
    return TrainedMethod(
        check=check_dflash_job,
        module=lambda target, settings, drafter, training: dflash_training_module(target, drafter, training),
        export=export_dflash_checkpoint,
        architectures=("DFlashDraftModel",),
        evaluation=lambda drafter_dir, settings: ("dflash", None),
    )
