"""DSpark (arXiv 2607.05147), chain verification: the DSpark drafter of `drafter.*` (a DFlash
drafter with a Markov head and, optionally, a confidence head) drafts a block in one pass,
the slots chosen in order under the Markov bias, cut before the first slot whose confidence
is below `dspark.confidence_threshold` (`dflash.dspark.proposer`); the target verifies at
`decoding.block_size` (None: the drafter's trained block size). Evaluation group `dspark`;
training group `method=dspark` (`DSparkTrainSettings`, the objective `dflash.dspark.objective`),
exported as a DSparkDraftModel that llama.cpp serves with --spec-type draft-dspark."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.methods.dflash import export as export_dflash
from dflash.methods.dflash import width_label
from dflash.methods.dflash_lookup import check_lookup_ngram, lookup_first
from dflash.structured import config_key


@dataclass  # not frozen: Hydra merges the config group into it
class DSparkSettings:
    """The `dspark` config group."""

    confidence_threshold: float = 0.0
    """In [0, 1): a draft stops before the first slot whose confidence head's probability is
    below it (llama.cpp's --spec-draft-p-min); 0 never stops. > 0 needs a confidence head."""
    lookup_ngram: int | None = None
    """Prompt lookup first (as `dflash_lookup.ngram`): a step whose context's last n tokens
    occurred earlier drafts what followed them and skips the drafter; null: the drafter always."""

    def __post_init__(self):
        threshold = self.confidence_threshold
        require(0 <= threshold < 1, "confidence_threshold", f"must be in [0, 1), got {threshold}")
        check_lookup_ngram(self.lookup_ngram)


@dataclass
class DSparkTrainSettings:
    """The `method` group of `method=dspark` (dflash/conf/method/dspark.yaml); the drafter's
    layers are the `drafter` group's, as for DFlash. Defaults: DeepSpec's (docs/frontier.md 2.1)."""

    name: str = "dspark"
    markov_rank: int = 256
    """R of the Markov head (two V x R tables: 25M parameters at SmolLM2's V = 49,152)."""
    confidence_head: bool = True
    """Train a confidence head (what `dspark.confidence_threshold` cuts on)."""
    ce_alpha: float = 0.1
    """Weight of the cross-entropy of the biased draft to the data token."""
    tv_alpha: float = 0.9
    """Weight of |p_draft - p_target|_1, the target's distribution at the same position."""
    confidence_alpha: float = 1.0
    """Weight of the confidence head's BCE to 1 - TV(p_draft, p_target)."""

    def __post_init__(self):
        require(self.markov_rank >= 1, "markov_rank", f"must be >= 1, got {self.markov_rank}")
        for key in ("ce_alpha", "tv_alpha", "confidence_alpha"):
            require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        require(self.ce_alpha + self.tv_alpha > 0, "ce_alpha", "ce_alpha + tv_alpha must be > 0: nothing would train the draft")


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
    proposer = lookup_first(
        DSparkProposer.for_target(context.drafter, target, settings.confidence_threshold), settings.lookup_ngram
    )
    return MethodSetup(proposer, ChainVerifier(), context.block_size or trained, context.drafter_label, trained)


def recorded(settings: DSparkSettings, context: EvalContext) -> dict:
    return {
        "block_size": context.block_size,
        "confidence_threshold": settings.confidence_threshold,
        "lookup_ngram": settings.lookup_ngram,
    }


def check_training(settings, drafter, data, training) -> None:
    """DFlash's checks, then what DSpark's loss does not read, refused before any model loads
    (one line naming the key)."""
    from dflash.errors import require
    from dflash.methods.dflash import check_training as check_dflash_training
    from dflash.structured import config_key

    check_dflash_training(settings, drafter, data, training)
    with config_key("training"):
        require(not training.agreement_mask, "agreement_mask", "is not supported with method=dspark")
        require(training.loss == "ce", "loss", "method=dspark sets its own loss (method.ce_alpha, tv_alpha, confidence_alpha)")
        require(
            training.draft_vocab_size is None,
            "draft_vocab_size",
            "must be null with method=dspark (its heads score the whole vocabulary)",
        )


def build_objective(target, settings: DSparkTrainSettings, drafter, training):
    from dflash.dspark.objective import DSparkObjective

    return DSparkObjective(target, drafter, training, settings)


def evaluation(drafter_dir: str, settings: DSparkTrainSettings) -> tuple[str, DSparkSettings]:
    return "dspark", DSparkSettings()


METHOD = Method(
    name="dspark",
    label="DSpark",
    build=build,
    settings=DSparkSettings,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
    train_settings=DSparkTrainSettings,
    check_training=check_training,
    build_objective=build_objective,
    export=export_dflash,  # the same state dict layout: heads are drafter parameters
    architectures=("DSparkDraftModel",),
    evaluation=evaluation,
)
