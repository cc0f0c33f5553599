"""Training DFlash drafters: anchors, block layout, sparse mask, loss, metrics, the
LightningModule and drafter export."""

from dflash.training.anchors import Anchors, sample_anchors, valid_anchor_mask
from dflash.training.blocks import Blocks, build_blocks
from dflash.training.config import TrainingConfig
from dflash.training.export import drafter_from_checkpoint, export_checkpoint, export_drafter
from dflash.training.loss import LossSettings, block_loss, default_gamma, dpace_weights, position_weights
from dflash.training.masks import block_attention_rule, dense_block_mask, factored_block_mask, flex_block_mask
from dflash.training.metrics import BlockMetrics, simulated_acceptance_length
from dflash.training.module import DFlashTrainingModule

__all__ = [
    "Anchors",
    "BlockMetrics",
    "Blocks",
    "DFlashTrainingModule",
    "LossSettings",
    "TrainingConfig",
    "block_attention_rule",
    "block_loss",
    "build_blocks",
    "default_gamma",
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
