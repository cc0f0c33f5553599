"""Training drafters: the LightningModule composed from a method's objective, and
DFlash's objective (anchors, block layout, sparse mask, loss, metrics) and export."""

from dflash.training.anchors import Anchors, sample_anchors, valid_anchor_mask
from dflash.training.blocks import Blocks, build_blocks
from dflash.training.config import TrainingConfig
from dflash.training.export import drafter_from_checkpoint, export_checkpoint, export_drafter
from dflash.training.loss import LossSettings, block_loss, default_gamma, dpace_weights, position_weights
from dflash.training.masks import block_attention_rule, dense_block_mask, factored_block_mask, flex_block_mask
from dflash.training.metrics import BlockMetrics, simulated_acceptance_length
from dflash.training.module import DrafterTrainingModule
from dflash.training.objective import DFlashObjective, Objective, TrainedMethod, dflash_training_module

__all__ = [
    "Anchors",
    "BlockMetrics",
    "Blocks",
    "DFlashObjective",
    "DrafterTrainingModule",
    "LossSettings",
    "Objective",
    "TrainedMethod",
    "TrainingConfig",
    "block_attention_rule",
    "block_loss",
    "build_blocks",
    "default_gamma",
    "dflash_training_module",
    "dense_block_mask",
    "dpace_weights",
    "factored_block_mask",
    "drafter_from_checkpoint",
    "export_checkpoint",
    "export_drafter",
    "flex_block_mask",
    "position_weights",
    "sample_anchors",
    "simulated_acceptance_length",
    "valid_anchor_mask",
]
