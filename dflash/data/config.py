"""`DataSpec`: the `data` config group as a plain dataclass; `RegenerateSettings`: how the target
answers its prompts (`dflash.data.regenerate`). Both are config schemas (dflash/schema.py): this
module imports no torch.

The group describes, in one place:
- the training conversations (`path` plus the `SourceSpec` reading keys): usually the
  directory the target's regenerated shards were written to;
- `sources`: where regeneration takes its prompts (a mix of hub datasets); empty means
  "the conversations at `path` themselves";
- how conversations are tokenised, and how the DataModule batches and splits them.
Its fields and defaults are the group's schema (dflash/schema.py); entry points build
it from the composed group with `dflash.structured.build`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dflash.data.sources import SourceSpec
from dflash.data.tokenize import TokenizeSettings
from dflash.errors import require

_SOURCE_FIELDS = [f.name for f in dataclasses.fields(SourceSpec)]
_TOKENIZE_FIELDS = [f.name for f in dataclasses.fields(TokenizeSettings)]


@dataclass
class DataSpec(SourceSpec):
    """The `data` config group (module docstring); the source fields are inherited from `SourceSpec`, documented there."""

    sources: list[SourceSpec] = field(default_factory=list)
    """Prompt sources for regeneration; empty: the conversations at `path`."""
    max_length: int = 3072
    """Tokens per training sequence (must match how the target is prompted at evaluation)."""
    require_chat_template: bool = False
    """A tokenizer without a chat template is an error."""
    enable_thinking: bool | None = False
    """Qwen3 thinking mode; None passes nothing to the template. Must match regeneration and evaluation
    (docs/design.md invariant 8)."""
    assistant_turns: str = "last"
    """"last" trains on the final (regenerated) turn; "all" on every assistant turn (plain-text tokenizers: the last)."""
    batch_size: int = 1
    """Sequences per device per step (each opens many anchor blocks)."""
    val_fraction: float = 0.05
    """Share of conversations held out, split with `seed`."""
    seed: int = 0
    """Both the held-out split's seed and, for the conversations at `path`, the seed of a
    `limit`'s draw (each of `sources` has its own `seed`)."""
    num_workers: int = 2
    """DataLoader workers."""
    cache_dir: str | None = None
    """The tokenisation cache (None: off)."""
    allow_partial: bool = False
    """Train on regenerated data that holds fewer rows than its manifest lists."""

    def source(self) -> SourceSpec:
        """The training conversations as a source."""
        return SourceSpec(**{name: getattr(self, name) for name in _SOURCE_FIELDS})

    def prompt_sources(self, key: str = "data") -> list[tuple[SourceSpec, str]]:
        """(source, config key) pairs regeneration reads prompts from."""
        if not self.sources:
            return [(self.source(), key)]
        return [(source, f"{key}.sources[{index}]") for index, source in enumerate(self.sources)]

    def tokenize_settings(self) -> TokenizeSettings:
        return TokenizeSettings(**{name: getattr(self, name) for name in _TOKENIZE_FIELDS})


@dataclass
class RegenerateSettings:
    """How the target regenerates responses."""

    batch_size: int = 16
    """Prompts per `generate` call (or concurrent requests to a server)."""
    shard_size: int = 512
    """Rows per output file; the unit of resumption."""
    max_new_tokens: int = 2048
    temperature: float = 0.0
    """0 for greedy decoding; top_p / top_k apply only when sampling."""
    top_p: float = 1.0
    """Applies only when sampling (temperature > 0)."""
    top_k: int = 0
    """Applies only when sampling; 0 = off, so a model's default top_k does not sneak in."""
    enable_thinking: bool | None = False
    """Passed to the chat template (Qwen3); None passes nothing."""
    seed: int = 0
    """Sampling seed; each shard reseeds with seed + its first row, so a resumed run samples
    the same way."""
    server_url: str | None = None
    """OpenAI-compatible server (vLLM, SGLang) base URL, e.g. "http://localhost:8000/v1";
    None generates with the HF target in-process."""
    server_model: str | None = None
    """Model name for the server; None asks the server's /models."""
    request_timeout_s: float = 600.0
    """Seconds a server request may take."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """ConfigError naming the field for out-of-range values."""
        for name in ("batch_size", "shard_size", "max_new_tokens"):
            require(getattr(self, name) >= 1, name, f"must be at least 1, got {getattr(self, name)}")
        require(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}")
