"""DSpark (arXiv 2607.05147), chain verification: the DSpark drafter of `drafter.*` (a DFlash
drafter with a Markov head and, optionally, a confidence head) drafts a block in one pass,
the slots chosen in order under the Markov bias, cut before the first slot whose confidence
is below `dspark.confidence_threshold` (`dflash.dspark.proposer`); the target verifies at
`decoding.block_size` (None: the drafter's trained block size). Evaluation group `dspark`."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.methods.dflash import width_label
from dflash.structured import config_key


@dataclass  # not frozen: Hydra merges the config group into it
class DSparkSettings:
    """The `dspark` config group."""

    confidence_threshold: float = 0.0
    """In [0, 1): a draft stops before the first slot whose confidence head's probability is
    below it (llama.cpp's --spec-draft-p-min); 0 never stops. > 0 needs a confidence head."""

    def __post_init__(self):
        threshold = self.confidence_threshold
        require(0 <= threshold < 1, "confidence_threshold", f"must be in [0, 1), got {threshold}")


def check_dspark_drafter(drafter, settings: DSparkSettings, context: EvalContext) -> None:
    """ConfigError unless the drafter has the heads the settings use (one line naming the key)."""
    with config_key("drafter"):
        name = drafter.config.architecture
        require(
            drafter.markov_head is not None, "path", f"holds a {name} (no Markov head); use methods=[dflash] or a DSpark drafter"
        )
    with config_key("dspark"):
        no_head = settings.confidence_threshold > 0 and drafter.confidence_head is None
        require(not no_head, "confidence_threshold", "the drafter has no confidence head; set it to 0")
    with config_key("decoding"):
        require(context.draft_threshold == 0, "draft_threshold", "cuts DFlash drafts; DSpark cuts by dspark.confidence_threshold")


def build(target, settings: DSparkSettings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier
    from dflash.dspark.proposer import DSparkProposer

    check_dspark_drafter(context.drafter, settings, context)
    trained = context.drafter.config.block_size
    proposer = DSparkProposer.for_target(context.drafter, target, settings.confidence_threshold)
    return MethodSetup(proposer, ChainVerifier(), context.block_size or trained, context.drafter_label, trained)


def recorded(settings: DSparkSettings, context: EvalContext) -> dict:
    return {"block_size": context.block_size, "confidence_threshold": settings.confidence_threshold}


METHOD = Method(
    name="dspark",
    label="DSpark",
    build=build,
    settings=DSparkSettings,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
)
