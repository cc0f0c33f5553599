"""EAGLE-3 (Li et al. 2025), the trained autoregressive baseline: a one-layer drafter over
[token embedding ; fused low/mid/high target features] drafting a chain of
`num_draft_tokens` tokens (`dflash.eagle3`). Evaluation group `eagle3`; training group
`method=eagle3` (`Eagle3TrainSettings`), exported in the EAGLE-3 directory layout that
SGLang and vLLM load."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.structured import config_key


@dataclass  # not frozen: Hydra merges the config group into it
class Eagle3Settings:
    """The `eagle3` config group."""

    path: str | None = None
    """None drafts with a randomly initialised EAGLE-3 drafter (the acceptance floor)."""
    num_draft_tokens: int = 7
    """k, the chain length (EAGLE-3's default 7)."""

    def __post_init__(self):
        require(self.num_draft_tokens >= 1, "num_draft_tokens", f"must be >= 1, got {self.num_draft_tokens}")


@dataclass
class Eagle3TrainSettings:
    """The `method` group of `method=eagle3` (dflash/conf/method/eagle3.yaml)."""

    name: str = "eagle3"
    ttt_length: int = 7
    """Training-time-test steps (published: 7)."""
    step_weight_decay: float = 0.8
    """Loss weight of step j is decay^j (published: 0.8)."""
    draft_vocab_size: int | None = None
    """None = the full target vocabulary, else the most frequent response tokens of the
    training data (d2t/t2d)."""
    target_layer_ids: list[int] | None = None
    """Three target layers, 0-based outputs (None: [1, L//2-1, L-4], as SGLang and vLLM)."""
    intermediate_size: int | None = None
    """MLP width (None: the target's)."""
    seed: int | None = None
    """Initialisation (None: the run's seed)."""

    def __post_init__(self):
        require(self.ttt_length >= 1, "ttt_length", f"must be >= 1, got {self.ttt_length}")
        require(0 < self.step_weight_decay <= 1, "step_weight_decay", f"must be in (0, 1], got {self.step_weight_decay}")


def check(settings: Eagle3Settings) -> None:
    if settings.path is not None:  # a wrong or damaged directory fails before the target loads
        from dflash.eagle3.io import read_eagle3_config

        with config_key("eagle3"):  # the keys of this method's group
            read_eagle3_config(settings.path)


def build(target, settings: Eagle3Settings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier
    from dflash.eagle3 import build_eagle3_proposer

    with config_key("eagle3"):
        proposer = build_eagle3_proposer(settings.path, target, settings.num_draft_tokens)
    return MethodSetup(proposer, ChainVerifier(), settings.num_draft_tokens + 1, settings.path or "random")


def build_objective(target, settings: Eagle3TrainSettings, drafter, training):
    """EAGLE-3's objective; the `drafter` and `training` groups are DFlash's."""
    from dflash.eagle3.objective import Eagle3Objective

    with config_key("method"):  # its settings are the train app's `method` group
        return Eagle3Objective(target, settings)


def export(checkpoint: dict, out_dir: str, dtype=None) -> str:
    from dflash.eagle3.io import export_eagle3_checkpoint

    return export_eagle3_checkpoint(checkpoint, out_dir, dtype)


def evaluation(drafter_dir: str, settings: Eagle3TrainSettings) -> tuple[str, Eagle3Settings]:
    return "eagle3", Eagle3Settings(path=drafter_dir, num_draft_tokens=settings.ttt_length)


METHOD = Method(
    name="eagle3",
    label="EAGLE-3",
    build=build,
    settings=Eagle3Settings,
    check=check,
    train_settings=Eagle3TrainSettings,
    build_objective=build_objective,
    export=export,
    architectures=("LlamaForCausalLMEagle3",),
    evaluation=evaluation,
)
