"""`DataSpec`: the `data` config group as a plain dataclass.

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
