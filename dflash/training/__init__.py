"""Training drafters: the LightningModule composed from a method's objective, DFlash's
anchors, block layout, sparse mask, loss, metrics and export.

The names below are imported on first use (PEP 562): reading the settings of
`dflash.training.config` or `dflash.training.settings` imports no Lightning.
"""

from dflash import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "dflash.training.anchors": ["Anchors", "sample_anchors", "valid_anchor_mask"],
        "dflash.training.blocks": ["Blocks", "build_blocks"],
        "dflash.training.config": ["TrainingSettings"],
        "dflash.training.export": ["drafter_from_checkpoint", "export_drafter"],
        "dflash.training.loss": ["LossSettings", "block_loss", "default_gamma", "dpace_weights", "position_weights"],
        "dflash.training.masks": ["block_attention_rule", "dense_block_mask", "factored_block_mask", "flex_block_mask"],
        "dflash.training.metrics": ["BlockMetrics", "simulated_acceptance_length"],
        "dflash.training.module": ["DrafterTrainingModule"],
        "dflash.training.objective": ["Objective"],
    },
)
