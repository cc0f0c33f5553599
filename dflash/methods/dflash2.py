"""DFlash2 (z-lab and Inco AI; docs/frontier.md 1.2), chain verification: the DFlash2 drafter of
`drafter.*` (a DFlash drafter with block-local convolutions in its layers and a top-K candidate
selector) drafts a block in one pass, the slots chosen by the selector's greedy walk from the
anchor (`dflash.dflash2.proposer`), stopped by `dflash2.p_min`; the target verifies at
`decoding.block_size` (None: the drafter's trained block size). Greedy decoding only. Evaluation
group `dflash2`; exported as a DFlash2DraftModel that llama.cpp serves with
--spec-type draft-dflash."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.methods.dflash import width_label
from dflash.structured import config_key


@dataclass  # not frozen: Hydra merges the config group into it
class DFlash2Settings:
    """The `dflash2` config group."""

    p_min: float = 0.0
    """In [0, 1): a draft stops before the first slot whose chosen candidate's softmax over the
    selector's K scores is below it (llama.cpp's --spec-draft-p-min); 0 never stops."""

    def __post_init__(self):
        require(0 <= self.p_min < 1, "p_min", f"must be in [0, 1), got {self.p_min}")


def check_dflash2_drafter(drafter, context: EvalContext) -> None:
    """ConfigError unless the drafter is a DFlash2 one and decoding is what it drafts for."""
    with config_key("drafter"):
        name = drafter.config.architecture
        require(drafter.candidate_selector is not None, "path", f"holds a {name} (no candidate selector); use a DFlash2 drafter")
    with config_key("decoding"):
        require(context.draft_threshold == 0, "draft_threshold", "cuts DFlash drafts; DFlash2 stops by dflash2.p_min")
        require(context.temperature == 0, "temperature", "must be 0 with methods=[dflash2]: DFlash2 drafts greedily only")


def build(target, settings: DFlash2Settings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier
    from dflash.dflash2.proposer import DFlash2Proposer

    check_dflash2_drafter(context.drafter, context)
    trained = context.drafter.config.block_size
    proposer = DFlash2Proposer.for_target(context.drafter, target, settings.p_min)
    return MethodSetup(proposer, ChainVerifier(), context.block_size or trained, context.drafter_label, trained)


def recorded(settings: DFlash2Settings, context: EvalContext) -> dict:
    return {"block_size": context.block_size, "p_min": settings.p_min}


METHOD = Method(
    name="dflash2",
    label="DFlash2",
    build=build,
    settings=DFlash2Settings,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
    architectures=("DFlash2DraftModel",),
)
