"""What a drafting method is: the `Method` record every module of `dflash.methods` exports.

A method bundles, in one module of its own, named functions (heavy imports inside them,
so reading the registry imports no model code):
- `settings`: the dataclass schema of its evaluation config group (the group is named
  after the method, e.g. `ngram.*`), or None when it has no group of its own;
- `check(settings)`: checks that need no model (paths to read), run by the entry points
  before any model loads;
- `build(target, settings, context) -> MethodSetup`: its proposer and verifier for one
  evaluation;
- `recorded(settings, context)`: its settings as results.json records them;
- `label`: its name in tables and reports, and `width_label(block_size, recorded
  settings)` how a table names its verify width ("(k=7)" drafts per step by default);
- for trained methods (`python -m dflash.train method=NAME`): `train_settings`, the schema
  of the train app's `method` group; `check_training(settings, drafter, data, training)`,
  checks before any model loads (`DrafterSpec`, `DataSpec`, `TrainingSettings`; ConfigError
  naming the key); `build_objective(target, settings, drafter, training)`, its
  `dflash.training.objective.Objective` for the loaded `TargetModel`;
  `export(checkpoint, out_dir, dtype)`, the drafter directory of a checkpoint its
  objective saved (the dict `dflash.training.export.read_checkpoint` returns), without
  the target, returning out_dir; `architectures`, what its checkpoints' drafter config
  carries (how `python -m dflash.export` tells which method wrote one); and
  `evaluation(drafter_dir, settings)`, the (method name, evaluation settings or None)
  that evaluates the exported drafter after training.
The evaluator, the CLIs, training, export and reports iterate `dflash.methods.METHODS`
and never name a method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class MethodSetup:
    """A method ready to run in one evaluation: `dflash.decoding.generate` with these.

    proposer: a `dflash.decoding.Proposer`; verifier: a `dflash.decoding.Verifier`.
    block_size: the verify width B (drafts per step <= B - 1); recorded as the method's block_size.
    label: what drafted, for results.json (a drafter path, "random", or the lookup settings).
    trained_block_size: the drafter's training block size, when it has one.
    """

    proposer: Any
    verifier: Any
    block_size: int
    label: str
    trained_block_size: int | None = None


@dataclass
class EvalContext:
    """What a builder may use besides the target and its own settings.

    drafter: the DFlash drafter built from `drafter.*` (None unless a listed method has
        `uses_dflash_drafter`); drafter_label: its path, or "random".
    block_size / draft_threshold / temperature: `decoding.block_size` (None: the drafter's
        trained one), `decoding.draft_threshold` and `decoding.temperature`.
    """

    drafter: Any = None
    drafter_label: str = "unspecified"
    block_size: int | None = None
    draft_threshold: float = 0.0
    temperature: float = 0.0


def _drafts_per_step(block_size: int, settings: dict) -> str:
    return f"(k={block_size - 1})"


def _no_check(*settings) -> None:
    return None


def _as_dict(settings, context: EvalContext) -> dict:
    return dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else {}


@dataclass(frozen=True)
class Method:
    """One drafting method (see the module docstring)."""

    name: str
    label: str
    build: Callable[[Any, Any, EvalContext], MethodSetup]
    settings: type | None = None
    check: Callable[[Any], None] = _no_check
    recorded: Callable[[Any, EvalContext], dict] = _as_dict
    uses_dflash_drafter: bool = False
    width_label: Callable[[int, dict], str] = _drafts_per_step
    train_settings: type | None = None
    check_training: Callable[[Any, Any, Any, Any], None] = _no_check
    build_objective: Callable[[Any, Any, Any, Any], Any] | None = None
    export: Callable[[dict, str, Any], str] | None = None
    architectures: tuple[str, ...] = ()
    evaluation: Callable[[str, Any], tuple[str, Any]] | None = None

    def default_settings(self):
        """Its evaluation settings with every default (None without a group)."""
        return None if self.settings is None else self.settings()
