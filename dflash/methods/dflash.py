"""DFlash, chain verification: the drafter of `drafter.*` drafts a block in one pass, the
target verifies it at `decoding.block_size` (None: the drafter's trained block size), and
drafts stop early where their confidence falls below `decoding.draft_threshold`.
Training: `dflash.training.objective` (DFlash's objective) (the `drafter` and `training` groups)."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.methods.base import EvalContext, Method, MethodSetup


def dflash_proposer(target, context: EvalContext, threshold: float):
    """A `DFlashProposer` over the context's drafter (with a confidence cut-off when threshold > 0)."""
    from dflash.decoding import DFlashProposer
    from dflash.decoding.adaptive import ThresholdProposer

    proposer = DFlashProposer(context.drafter, target.embed, target.draft_logits)
    return ThresholdProposer(proposer, threshold) if threshold > 0 else proposer


def build(target, settings, context: EvalContext) -> MethodSetup:
    trained = context.drafter.config.block_size
    proposer = dflash_proposer(target, context, context.draft_threshold)
    return MethodSetup(proposer, block_size=context.block_size or trained, label=context.drafter_label, trained_block_size=trained)


def recorded(settings, context: EvalContext) -> dict:
    return {"block_size": context.block_size, "draft_threshold": context.draft_threshold}


@dataclass
class DFlashTrainSettings:
    """The `method` group of `method=dflash` (the default): DFlash is configured by the
    `drafter` and `training` groups."""

    name: str = "dflash"


def training():
    """DFlash's `dflash.training.objective.TrainedMethod`."""
    from dflash.training.objective import dflash_trained_method

    return dflash_trained_method()


METHOD = Method(
    name="dflash",
    label="DFlash",
    build=build,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=lambda block_size, settings: f"(B={block_size})",
    training=training,
    train_settings=DFlashTrainSettings,
)
