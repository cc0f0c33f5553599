"""DFlash with prompt lookup first (`dflash.decoding.ngram.LookupFirst`): a step whose
context's last `dflash_lookup.ngram` tokens occurred earlier, with a whole draft after them,
drafts what followed them (up to `dflash_lookup.tokens`, past the block) and skips the drafter;
every other step drafts with the DFlash drafter of `drafter.*`, as `dflash`. Chain
verification at `decoding.block_size` (None: the drafter's trained block size). Config group
`dflash_lookup`."""

from __future__ import annotations

from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.methods.dflash import dflash_proposer, width_label
from dflash.methods.dflash import recorded as dflash_recorded


@dataclass  # not frozen: Hydra merges the config group into it
class LookupSettings:
    """The `dflash_lookup` config group."""

    ngram: int = 3
    """The context's last n tokens a lookup matches (>= 1): shorter ones match more often and
    guess worse; a step that finds no match drafts with the drafter."""
    tokens: int | None = None
    """The most tokens a lookup step drafts (>= 1; None, or at most B - 1: as the drafter's
    B - 1): the verify is then that wide on lookup steps, the drafter's steps stay at its block."""

    def __post_init__(self):
        require(self.ngram >= 1, "ngram", f"must be >= 1, got {self.ngram}")
        require(self.tokens is None or self.tokens >= 1, "tokens", f"must be >= 1 (null: the drafter's B - 1), got {self.tokens}")


def lookup_first(proposer, ngram: int | None, inner_block: int | None = None):
    """`proposer` (drafting blocks of `inner_block`; None: the loop's) behind prompt lookup of
    the context's last `ngram` tokens (None: `proposer` itself)."""
    if ngram is None:
        return proposer
    from dflash.decoding.ngram import LookupFirst

    return LookupFirst(proposer, ngram, inner_block)


def check_lookup_ngram(ngram: int | None) -> None:
    """ConfigError naming `lookup_ngram` unless it is None or >= 1."""
    require(ngram is None or ngram >= 1, "lookup_ngram", f"must be >= 1 (null: no lookup), got {ngram}")


def build(target, settings: LookupSettings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import ChainVerifier

    trained = context.drafter.config.block_size
    block = context.block_size or trained
    proposer = lookup_first(dflash_proposer(target, context), settings.ngram, block)
    width = max(block, settings.tokens + 1) if settings.tokens else block
    return MethodSetup(proposer, ChainVerifier(), width, context.drafter_label, trained)


def recorded(settings: LookupSettings, context: EvalContext) -> dict:
    return {**dflash_recorded(settings, context), "ngram": settings.ngram, "lookup_tokens": settings.tokens}


METHOD = Method(
    name="dflash_lookup",
    label="DFlash + lookup",
    build=build,
    settings=LookupSettings,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
)
