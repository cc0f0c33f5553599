"""DFlash2 (z-lab and Inco AI; docs/frontier.md 1.2), chain verification: the DFlash2 drafter of
`drafter.*` (a DFlash drafter with block-local convolutions in its layers and a top-K candidate
selector) drafts a block in one pass, the slots chosen by the selector's greedy walk from the
anchor (`dflash.dflash2.proposer`), stopped by `dflash2.p_min`; the target verifies at
`decoding.block_size` (None: the drafter's trained block size); a sampling target verifies the
same deterministic drafts by its rule. Evaluation
group `dflash2`; training group `method=dflash2` (`DFlash2TrainSettings`, the objective
`dflash.dflash2.objective`); exported as a DFlash2DraftModel that llama.cpp serves with
--spec-type draft-dflash."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.methods.dflash import export as export_dflash
from dflash.methods.dflash import width_label
from dflash.methods.dflash_lookup import check_lookup_ngram, lookup_first
from dflash.structured import config_key


@dataclass  # not frozen: Hydra merges the config group into it
class DFlash2Settings:
    """The `dflash2` config group."""

    p_min: float = 0.0
    """In [0, 1): a draft stops before the first slot whose chosen candidate's softmax over the
    selector's K scores is below it (llama.cpp's --spec-draft-p-min); 0 never stops."""
    lookup_ngram: int | None = None
    """Prompt lookup first (as `dflash_lookup.ngram`): a step whose context's last n tokens
    occurred earlier drafts what followed them and skips the drafter; null: the drafter always."""

    def __post_init__(self):
        require(0 <= self.p_min < 1, "p_min", f"must be in [0, 1), got {self.p_min}")
        check_lookup_ngram(self.lookup_ngram)


@dataclass
class DFlash2TrainSettings:
    """The `method` group of `method=dflash2` (dflash/conf/method/dflash2.yaml); the drafter's
    layers are the `drafter` group's, as for DFlash. Defaults: the released checkpoints'
    (docs/frontier.md 1.2, 5.4). llama.cpp needs hidden_size % conv_group_size == 0 and
    hidden_size >= selector_top_k·(selector_top_k + 1): the target decides, checked when it loads."""

    name: str = "dflash2"
    conv_kernel_size: int = 2
    """Taps of the block-local convolution around attention and around the MLP of every layer."""
    conv_group_size: int = 16
    """Channels sharing one dynamic coefficient."""
    selector_rank: int = 256
    """R of the selector (two V x R codebooks: 25M parameters at SmolLM2's V = 49,152)."""
    selector_top_k: int = 16
    """Candidates per slot the selector scores (SmolLM2's hidden 576 allows up to 23, the tiny targets' 64 up to 7)."""
    selector_alpha: float = 1.0
    """Weight of the selector's cross-entropy over the K candidates (unknown upstream default)."""

    def __post_init__(self):
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.selector_alpha >= 0, "selector_alpha", f"must be >= 0, got {self.selector_alpha}")


def check_dflash2_drafter(drafter, context: EvalContext) -> None:
    """ConfigError unless the drafter is a DFlash2 one and decoding is what it drafts for."""
    with config_key("drafter"):
        name = drafter.config.architecture
        require(drafter.candidate_selector is not None, "path", f"holds a {name} (no candidate selector); use a DFlash2 drafter")
    with config_key("decoding"):
        require(context.draft_threshold == 0, "draft_threshold", "cuts DFlash drafts; DFlash2 stops by dflash2.p_min")


def build(target, settings: DFlash2Settings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier
    from dflash.dflash2.proposer import DFlash2Proposer

    check_dflash2_drafter(context.drafter, context)
    trained = context.drafter.config.block_size
    proposer = lookup_first(DFlash2Proposer.for_target(context.drafter, target, settings.p_min), settings.lookup_ngram)
    return MethodSetup(proposer, ChainVerifier(), context.block_size or trained, context.drafter_label, trained)


def recorded(settings: DFlash2Settings, context: EvalContext) -> dict:
    return {"block_size": context.block_size, "p_min": settings.p_min, "lookup_ngram": settings.lookup_ngram}


def check_training(settings, drafter, data, training) -> None:
    """DFlash's checks, then what DFlash2's loss does not read, refused before any model loads."""
    from dflash.methods.dflash import check_training as check_dflash_training

    check_dflash_training(settings, drafter, data, training)
    with config_key("training"):
        require(not training.agreement_mask, "agreement_mask", "is not supported with method=dflash2")
        require(
            training.draft_vocab_size is None,
            "draft_vocab_size",
            "must be null with method=dflash2 (its selector's candidates are ids of the whole vocabulary, as llama.cpp's)",
        )


def build_objective(target, settings: DFlash2TrainSettings, drafter, training):
    from dflash.dflash2.objective import DFlash2Objective

    return DFlash2Objective(target, drafter, training, settings)


def evaluation(drafter_dir: str, settings: DFlash2TrainSettings) -> tuple[str, DFlash2Settings]:
    return "dflash2", DFlash2Settings()


METHOD = Method(
    name="dflash2",
    label="DFlash2",
    build=build,
    settings=DFlash2Settings,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
    train_settings=DFlash2TrainSettings,
    check_training=check_training,
    build_objective=build_objective,
    export=export_dflash,  # the same state dict layout: heads are drafter parameters
    architectures=("DFlash2DraftModel",),
    evaluation=evaluation,
)
