"""DFlash, chain verification: the drafter of `drafter.*` drafts a block in one pass, the
target verifies it at `decoding.block_size` (None: the drafter's trained block size), and
drafts stop early where their confidence falls below `decoding.draft_threshold`.
Training: `dflash.dflash.objective` (the `drafter` and `training` groups)."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.structured import config_key


def dflash_proposer(target, context: EvalContext):
    """A `DFlashProposer` over the context's drafter (with a confidence cut-off when its draft_threshold > 0)."""
    from dflash.dflash.adaptive import ThresholdProposer
    from dflash.dflash.proposer import DFlashProposer

    proposer = DFlashProposer.for_target(context.drafter, target)
    return ThresholdProposer(proposer, context.draft_threshold) if context.draft_threshold > 0 else proposer


def build(target, settings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier

    trained = context.drafter.config.block_size
    proposer = dflash_proposer(target, context)
    return MethodSetup(proposer, ChainVerifier(), context.block_size or trained, context.drafter_label, trained)


def recorded(settings, context: EvalContext) -> dict:
    return {"block_size": context.block_size, "draft_threshold": context.draft_threshold}


@dataclass
class DFlashTrainSettings:
    """The `method` group of `method=dflash` (the default): DFlash is configured by the
    `drafter` and `training` groups."""

    name: str = "dflash"


def width_label(block_size: int, settings: dict) -> str:
    return f"(B={block_size})"


def check_training(settings, drafter, data, training) -> None:
    """The drafter's block fits the data; a drafter directory is read now, so a damaged or
    mismatched one fails before the target loads."""
    from dflash.training.config import check_block_fits

    block_size = drafter.block_size
    if drafter.path is not None:
        from dflash.drafter.io import check_drafter_dir

        with config_key("drafter"):
            block_size = check_drafter_dir(drafter.path).block_size
    check_block_fits(block_size, data.max_length, training.num_anchors)


def build_objective(target, settings, drafter, training):
    """DFlash's objective; its `method` group holds nothing it reads."""
    from dflash.dflash.objective import DFlashObjective

    return DFlashObjective(target, drafter, training)


def export(checkpoint: dict, out_dir: str, dtype=None) -> str:
    from dflash.training.export import export_state

    return export_state(checkpoint, out_dir, dtype=dtype)


def evaluation(drafter_dir: str, settings) -> tuple[str, None]:
    return "dflash", None


METHOD = Method(
    name="dflash",
    label="DFlash",
    build=build,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
    train_settings=DFlashTrainSettings,
    check_training=check_training,
    build_objective=build_objective,
    export=export,
    architectures=("DFlashDraftModel",),
    evaluation=evaluation,
)
