"""`DataSpec`: the `data` config group as a plain dataclass.

The group describes, in one place:
- the training conversations (`path` plus the `SourceSpec` reading keys): usually the
  directory the target's regenerated shards were written to;
- `sources`: where regeneration takes its prompts (a mix of hub datasets); empty means
  "the conversations at `path` themselves";
- how conversations are tokenised, and how the DataModule batches and splits them.
Entry points build it with `DataSpec.from_dict(plain_dict)`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dflash.data.sources import SourceSpec
from dflash.data.tokenize import TokenizeSettings
from dflash.errors import require, spec_from_dict

_SOURCE_FIELDS = [f.name for f in dataclasses.fields(SourceSpec)]
_TOKENIZE_FIELDS = [f.name for f in dataclasses.fields(TokenizeSettings)]


@dataclass
class DataSpec(SourceSpec):
    """Everything in the `data` config group (see dflash/conf/data/*.yaml for meanings): the
    training conversations' source fields (inherited), regeneration sources,
    tokenisation and DataModule settings."""

    sources: list[SourceSpec] = field(default_factory=list)
    max_length: int = 3072
    require_chat_template: bool = False
    enable_thinking: bool | None = False
    assistant_turns: str = "last"
    batch_size: int = 1
    val_fraction: float = 0.01
    seed: int = 0
    num_workers: int = 2
    cache_dir: str | None = None
    allow_partial: bool = False

    @classmethod
    def from_dict(cls, data: dict, key: str = "data") -> "DataSpec":
        """Build from a plain dict; unknown keys and mistyped values (also inside `sources`)
        are ConfigErrors naming the key."""
        data = dict(data)
        raw_sources = data.pop("sources", None) or []
        require(isinstance(raw_sources, list), f"{key}.sources", "must be a list of sources")
        sources = []
        for index, raw in enumerate(raw_sources):
            source_key = f"{key}.sources[{index}]"
            require(isinstance(raw, dict) and "path" in raw, source_key, "each source needs at least a path")
            sources.append(spec_from_dict(SourceSpec, raw, source_key))
        require(data.get("path") is not None, f"{key}.path", "is required")
        spec = spec_from_dict(cls, data, key)
        spec.sources = sources
        return spec

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

