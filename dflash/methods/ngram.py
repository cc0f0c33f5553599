"""Prompt lookup (n-gram drafting, `dflash.decoding.ngram`): drafts the tokens that
followed the latest earlier occurrence of the context's last n-gram. Config group `ngram`."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup


@dataclass  # not frozen: Hydra merges the config group into it
class NgramSettings:
    """The `ngram` config group."""

    max_ngram: int = 2
    """The longest n-gram length tried (tried first, down to min_ngram)."""
    min_ngram: int = 1
    """The shortest n-gram length tried."""
    num_draft_tokens: int = 10
    """The most tokens proposed per verify step (verify width = it + 1)."""

    def __post_init__(self):
        require(self.min_ngram >= 1, "min_ngram", f"must be >= 1, got {self.min_ngram}")
        require(
            self.max_ngram >= self.min_ngram,
            "max_ngram",
            f"must be >= ngram.min_ngram ({self.min_ngram}), got {self.max_ngram}",
        )
        require(self.num_draft_tokens >= 1, "num_draft_tokens", f"must be >= 1, got {self.num_draft_tokens}")


def build(target, settings: NgramSettings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier
    from dflash.decoding.ngram import NgramProposer

    label = f"prompt lookup (n {settings.max_ngram}..{settings.min_ngram}, {settings.num_draft_tokens} tokens)"
    return MethodSetup(NgramProposer(settings), ChainVerifier(), settings.num_draft_tokens + 1, label)


METHOD = Method(name="ngram", label="Prompt lookup", build=build, settings=NgramSettings)
