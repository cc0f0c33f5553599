"""DFlash, tree verification (`dflash.decoding.tree`): the drafter of `drafter.*` at
`decoding.block_size`, its slot distributions expanded into a token tree of `budget`
draft nodes that the target verifies in one forward (budget + 1 tokens); nodes whose
path score is below `decoding.draft_threshold` are left out; with `lookup_ngram`, prompt lookup
first (`dflash.decoding.ngram.LookupFirst`), a found chain verified as a tree of one branch.
Config group `dflash_tree`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dflash.errors import require
from dflash.methods.base import EvalContext, Method, MethodSetup
from dflash.methods.dflash_lookup import check_lookup_ngram, lookup_first


@dataclass  # not frozen: Hydra merges the config group into it
class TreeSettings:
    """The `dflash_tree` config group."""

    budget: int = 16
    """Draft nodes per verify step."""
    lookup_ngram: int | None = None
    """Prompt lookup first, as `dflash_lookup` (the context's last n tokens; null: none): a lookup
    step drafts the chain that followed them, the drafter's steps a tree."""
    lookup_tokens: int | None = None
    """The most tokens a lookup step drafts, as `dflash_lookup.tokens` (null: the drafter's B - 1);
    its verify is then that wide, the drafter's trees stay B - 1 deep."""

    def __post_init__(self):
        require(self.budget >= 1, "budget", f"must be >= 1, got {self.budget}")
        check_lookup_ngram(self.lookup_ngram)
        require(
            self.lookup_tokens is None or (self.lookup_tokens >= 1 and self.lookup_ngram is not None),
            "lookup_tokens",
            f"must be >= 1 with lookup_ngram set (null: the drafter's B - 1), got {self.lookup_tokens}",
        )


def build(target, settings: TreeSettings, context: EvalContext) -> MethodSetup:
    from dflash.decoding import TreeVerifier
    from dflash.dflash.proposer import DFlashProposer

    trained = context.drafter.config.block_size
    block_size = context.block_size or trained
    require(block_size >= 2, "decoding.block_size", f"tree verification drafts, so it needs >= 2, got {block_size}")
    verifier = TreeVerifier(settings.budget, context.draft_threshold)
    proposer = lookup_first(DFlashProposer.for_target(context.drafter, target), settings.lookup_ngram, block_size)
    width = max(block_size, settings.lookup_tokens + 1) if settings.lookup_tokens else block_size
    return MethodSetup(proposer, verifier, width, context.drafter_label, trained)


def recorded(settings: TreeSettings, context: EvalContext) -> dict:
    return {"block_size": context.block_size, **dataclasses.asdict(settings), "draft_threshold": context.draft_threshold}


def width_label(block_size: int, settings: dict) -> str:
    lookup = f", lookup {settings['lookup_ngram']}" if settings.get("lookup_ngram") else ""
    lookup += f" x {settings['lookup_tokens']}" if settings.get("lookup_tokens") else ""
    return f"(B={block_size}, N={settings.get('budget')}{lookup})"


METHOD = Method(
    name="dflash_tree",
    label="DFlash, tree",
    build=build,
    settings=TreeSettings,
    recorded=recorded,
    uses_dflash_drafter=True,
    width_label=width_label,
)
