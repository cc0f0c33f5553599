"""The drafting methods one evaluation can compare: name -> how to build it for a target.

A method is built once per evaluation into a `MethodSetup`: its proposer, its verify
width (at most width - 1 drafts per verify step), a label for the results, and
optionally its own decoding loop. Every method then runs on the same prompts with the
same seeds, stop ids and sampling settings as the autoregressive baseline.

A loop of its own has `dflash.decoding.generate`'s signature, minus `block_size`:
`loop(target, input_ids, *, max_new_tokens, proposer, stop_token_ids, sampling,
generator, **options) -> GenerationResult`, e.g. tree verification's `generate_tree`
with options {"dflash_tree.budget": ...}. Methods without one run `generate(block_size=width)`.

Adding a method: a settings dataclass (the method's config group, built by the entry
point) and a builder `(target, settings) -> MethodSetup`, registered in `METHODS`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from dflash.decoding.ngram import NgramProposer, NgramSettings
from dflash.errors import ConfigError, require
from dflash.target import TargetModel


@dataclass
class MethodSetup:
    """A method ready to run.

    proposer: a `Proposer` or `TokenProposer`.
    block_size: the verify width B (drafts per step <= B - 1); recorded as the method's block_size.
    label: what drafted, for results.json (a drafter path, "random", or the lookup settings).
    loop: its own decoding loop (module docstring); None runs `dflash.decoding.generate`.
    options: extra keyword arguments of `loop`.
    trained_block_size: the drafter's training block size, when it has one.
    """

    proposer: Any
    block_size: int
    label: str
    loop: Callable | None = None
    options: dict = field(default_factory=dict)
    trained_block_size: int | None = None


@dataclass
class DFlashMethod:
    """What the dflash builder needs: a `DFlashProposer` over the drafter (which the entry
    point builds from `drafter.*`), the drafter's trained block size, and
    `decoding.block_size` (None: the trained one)."""

    proposer: Any
    trained_block_size: int
    block_size: int | None = None
    label: str = "unspecified"


@dataclass  # not frozen: Hydra merges the config group into it
class Eagle3Settings:
    """The `eagle3` config group: path None drafts with a randomly initialised EAGLE-3 drafter
    (the acceptance floor); num_draft_tokens k, the chain length (EAGLE-3's default 7)."""

    path: str | None = None
    num_draft_tokens: int = 7

    def __post_init__(self):
        require(self.num_draft_tokens >= 1, "eagle3.num_draft_tokens", f"must be >= 1, got {self.num_draft_tokens}")


@dataclass  # not frozen: Hydra merges the config group into it
class TreeSettings:
    """The `dflash_tree` config group (method dflash_tree): the DFlash drafter (`drafter.*`,
    `decoding.block_size`) verified as a token tree (`dflash.decoding.tree`).

    budget: draft nodes per verify step (the target verifies budget + 1 tokens at once).
    `decoding.draft_threshold` leaves out nodes whose path score (product of slot
    probabilities) is below it.
    """

    budget: int = 16

    def __post_init__(self):
        require(self.budget >= 1, "dflash_tree.budget", f"must be >= 1, got {self.budget}")


@dataclass
class DFlashTreeMethod:
    """What the dflash_tree builder needs: the dflash method's settings, the tree's, and
    `decoding.draft_threshold`."""

    dflash: DFlashMethod
    tree: TreeSettings
    draft_threshold: float = 0.0


def build_dflash(target: TargetModel, settings: DFlashMethod) -> MethodSetup:
    return MethodSetup(
        proposer=settings.proposer,
        block_size=settings.block_size or settings.trained_block_size,
        label=settings.label,
        trained_block_size=settings.trained_block_size,
    )


def build_dflash_tree(target: TargetModel, settings: DFlashTreeMethod) -> MethodSetup:
    from dflash.decoding.tree import generate_tree

    chain = build_dflash(target, settings.dflash)
    options = dict(block_size=chain.block_size, tree_budget=settings.tree.budget, draft_threshold=settings.draft_threshold)
    return MethodSetup(chain.proposer, chain.block_size, chain.label, generate_tree, options, chain.trained_block_size)


def build_ngram(target: TargetModel, settings: NgramSettings) -> MethodSetup:
    label = f"prompt lookup (n {settings.max_ngram}..{settings.min_ngram}, {settings.num_draft_tokens} tokens)"
    return MethodSetup(NgramProposer(settings), block_size=settings.num_draft_tokens + 1, label=label)


def build_eagle3(target: TargetModel, settings: Eagle3Settings) -> MethodSetup:
    try:
        module = importlib.import_module(EAGLE3_PACKAGE)
    except ModuleNotFoundError as err:
        if err.name not in (EAGLE3_PACKAGE, "dflash"):
            raise
        raise ConfigError("methods", _missing("eagle3", EAGLE3_PACKAGE)) from None
    proposer = module.build_eagle3_proposer(settings.path, target, settings.num_draft_tokens)
    return MethodSetup(proposer, block_size=settings.num_draft_tokens + 1, label=settings.path or "random")


@dataclass(frozen=True)
class Method:
    """A registry entry: the settings type of its config group, its builder, and the package
    it imports lazily (checked by `check_method_names`, before any model loads)."""

    settings: type
    build: Callable[[TargetModel, Any], MethodSetup]
    package: str | None = None


EAGLE3_PACKAGE = "dflash.eagle3"
#: methods that draft with the DFlash drafter of `drafter.*`
DRAFTER_METHODS = ("dflash", "dflash_tree")
METHODS: dict[str, Method] = {
    "dflash": Method(DFlashMethod, build_dflash),
    "dflash_tree": Method(TreeSettings, build_dflash_tree),
    "eagle3": Method(Eagle3Settings, build_eagle3, package=EAGLE3_PACKAGE),
    "ngram": Method(NgramSettings, build_ngram),
}


def _missing(name: str, package: str) -> str:
    return f"{name} is not available in this installation (no {package} package)"


def _installed(package: str) -> bool:
    if package in sys.modules:  # imported already (None: marked absent)
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def check_method_names(names: list[str]) -> None:
    """ConfigError unless `names` is a non-empty list of distinct registered methods."""
    require(isinstance(names, list) and len(names) > 0, "methods", f"must be a non-empty list, e.g. [dflash], got {names!r}")
    unknown = [name for name in names if name not in METHODS]
    require(not unknown, "methods", f"unknown method {unknown[0]!r}; choose from {sorted(METHODS)}" if unknown else "")
    require(len(set(names)) == len(names), "methods", f"a method is listed twice: {names}")
    for name in names:
        package = METHODS[name].package
        require(package is None or _installed(package), "methods", _missing(name, package))


def build_method(name: str, target: TargetModel, settings: Any) -> MethodSetup:
    """Build registered method `name` for `target` with its settings (see `METHODS`)."""
    check_method_names([name])
    return METHODS[name].build(target, settings)
