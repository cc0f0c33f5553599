"""The evaluation's settings: the `decoding` config group (`DecodingSettings`) and everything
`dflash.eval.evaluate` needs besides the models and the prompts (`EvalSettings`).

Config schemas (dflash/schema.py): this module imports no torch, so a bad value is refused
before the evaluator and the models load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash.decoding.sampling import SamplingConfig
from dflash.errors import require
from dflash.methods import check_method_names


@dataclass
class DecodingSettings:
    """The `decoding` config group."""

    block_size: int | None = None
    """Inference block size B; None = the drafter's trained block size (they may differ: an
    ablation crosses train B with inference B)."""
    max_new_tokens: int = 2048
    temperature: float = 0.0
    """0 is greedy; top_p and top_k filter the sampled distribution, target's and drafter's alike."""
    top_p: float = 1.0
    """Filters the sampled distribution, target's and drafter's alike; 1.0: off."""
    top_k: int = 0
    """Filters the sampled distribution, target's and drafter's alike; 0: off."""
    verify_rule: str = "rejection"
    """Sampling only: "rejection" (speculative sampling) or "match" (keep drafts equal to the
    target's own samples)."""
    seed: int = 0
    """Seeds the sampling generators (one per generation and method)."""
    stop_tokens: list = field(default_factory=list)
    """Extra stop tokens, as token strings or ids, on top of eos and end-of-turn markers."""
    draft_threshold: float = 0.0
    """The DFlash drafter's drafts (chain and tree) stop where the product of the slots' top
    probabilities falls below it (`dflash.dflash.adaptive`); 0 drafts the whole block every step."""

    def __post_init__(self):
        # checked here too (not only in `generate`) so bad values fail before a model loads
        require(self.block_size is None or self.block_size >= 1, "block_size", f"must be >= 1, got {self.block_size}")
        require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        require(0 <= self.draft_threshold <= 1, "draft_threshold", f"must be in [0, 1], got {self.draft_threshold}")
        _ = self.sampling  # validates temperature, top_p, top_k, verify_rule

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.top_k, self.verify_rule)


@dataclass
class EvalSettings:
    """Everything `evaluate` needs besides the models and the prompts."""

    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    chat_template: bool = True
    """Prompt rendering (see `PromptBuilder`)."""
    enable_thinking: bool = False
    """Prompt rendering (see `PromptBuilder`)."""
    hf_generate: bool = True
    """Also time the target's `model.generate()`."""
    warmup_tokens: int = 16
    """Length of the untimed warm-up generation on the first prompt (0: none)."""
    methods: list = field(default_factory=lambda: ["dflash"])
    """The drafting methods compared (names in `dflash.methods.METHODS`), the primary first.
    Methods with `uses_dflash_drafter` draft with the `drafter` given to `evaluate` at
    `decoding.block_size`."""
    method_settings: dict = field(default_factory=dict)
    """Name -> that method's settings (its config group's schema, `Method.settings`); a method
    without an entry uses its defaults."""

    def __post_init__(self):
        require(self.warmup_tokens >= 0, "warmup_tokens", f"must be >= 0, got {self.warmup_tokens}")
        check_method_names(self.methods)
