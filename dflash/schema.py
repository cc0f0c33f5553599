"""The apps' config schemas, registered in Hydra's ConfigStore.

Every config group is described by one dataclass of the library (`TargetSpec`, `DataSpec`,
`TrainingSettings`, `DecodingSettings`, ...): its field defaults are the defaults, and the group's
YAML options hold only what differs from them. Each app's primary config (dflash/conf/<app>.yaml)
starts from its schema below (`- _train_schema` first in its defaults list), so composition itself
rejects an unknown key or a value of the wrong type. Range checks live in each dataclass's
`__post_init__` and name the field only; `dflash.structured.build` adds the group. Both run before
Hydra does (`dflash.cli.common.run_app`).

Names: an app's schema is `<App>AppConfig`; a group's `<Thing>Spec` for what is loaded or built
(`TargetSpec`, `DataSpec`), `<Thing>Settings` for knobs (`TrainingSettings`). A bare `Config` is
a model's own configuration (its config.json: `DrafterConfig`), never a schema of ours. A field's
description is the string literal right under it.

Invariants:
- The Python API and the command line get the same defaults: a composed app with no overrides,
  turned into objects, equals the dataclasses built with their defaults (tests/cli/test_config_schema.py).
- OmegaConf structured configs accept unions of primitive types and Optional, not unions with
  containers: such fields are `Any` and their `__post_init__` checks the type.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from dflash.data.config import DataSpec, RegenerateSettings
from dflash.errors import require
from dflash.eval.benchmarks import BenchmarkSpec
from dflash.eval.settings import DecodingSettings, EvalSettings
from dflash.methods import METHODS, check_method_names, trained_methods
from dflash.methods.dflash_tree import TreeSettings
from dflash.reports.tables import check_metric
from dflash.specs import DrafterSpec, TargetSpec
from dflash.structured import typed
from dflash.training.config import TrainingSettings
from dflash.training.settings import CheckpointSettings, LoggerSettings, TauRealSettings, TrainerSettings, weight_dtype

TABLE_SOURCES = ("dirs", "wandb")
DEMO_ANSWER_DTYPES = ("float32", "bfloat16")  # the demo's plan measures both where data_dtype is auto
DEMO_PRECISIONS = ("32-true", "bf16-mixed")  # likewise trainer.precision


def _default(cls, name: str):
    """The default of field `name` of dataclass `cls` (one place for defaults shared by two schemas)."""
    spec = {f.name: f for f in dataclasses.fields(cls)}[name]
    return spec.default if spec.default_factory is dataclasses.MISSING else spec.default_factory()


@dataclass
class PathsSettings:
    """The `paths` group."""

    root: str = MISSING
    """The working directory."""
    artifacts: str = MISSING
    """Everything the apps write (DFLASH_ARTIFACTS or paths.artifacts=...)."""
    output_dir: str = MISSING
    """The run's directory."""


@dataclass
class AfterTrainEvalSettings:
    """The train app's `eval` group: evaluation of the exported drafter at the end of
    training (eval.after_train=true), with the benchmark and decoding blocks of
    `python -m dflash.evaluate` (presets: benchmark@eval.benchmark=NAME, decoding@eval.decoding=NAME)."""

    benchmark: BenchmarkSpec = MISSING
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    after_train: bool = False
    hf_generate: bool = False
    """Also time the target's own model.generate() (off here: training runs compare against
    the autoregressive loop only)."""
    warmup_tokens: int = _default(EvalSettings, "warmup_tokens")
    """Untimed warm-up generation on the first prompt; 0: none."""
    tau_real: TauRealSettings = field(default_factory=TauRealSettings)
    """The real loop's tau on held-out prompts during training, logged as val/tau_real
    (`dflash.training.tau_real.TauRealSettings`; off by default)."""


@dataclass
class TrainAppConfig:
    """`python -m dflash.train` (dflash/conf/train.yaml)."""

    paths: PathsSettings = MISSING
    target: TargetSpec = MISSING
    drafter: DrafterSpec = MISSING
    data: DataSpec = MISSING
    training: TrainingSettings = MISSING
    method: Any = None
    """The `method` group: the trained method's `train_settings` (`dflash.methods`), the group
    option's own schema (dflash/conf/method/NAME.yaml starts from `_NAME_schema`)."""
    trainer: TrainerSettings = MISSING
    logger: LoggerSettings = MISSING
    eval: AfterTrainEvalSettings = MISSING
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    run_name: str = MISSING
    """Directory under ${paths.artifacts}/runs (train.yaml derives it from the command line)."""
    seed: int = 0
    """The run's seed (data order, anchors, and the drafter's initialisation unless drafter.seed is set)."""
    cpu_threads: int | None = None
    """Torch intra-op threads; None: torch's default."""
    sweep: Any = None
    """`+sweep=NAME` (dflash/conf/sweep/): the sweep's own keys, read by dflash.sweep."""

    def __post_init__(self):
        check_cpu_threads(self.cpu_threads)


def check_cpu_threads(threads: int | None) -> None:
    require(threads is None or threads >= 1, "cpu_threads", f"must be a positive integer or null, got {threads!r}")


@dataclass
class _EvaluateAppKeys:
    """`python -m dflash.evaluate` (dflash/conf/evaluate.yaml); `EvaluateAppConfig` adds one
    group per method with settings, named after it and typed by its schema
    (`dflash.methods`; e.g. `ngram.*`), present with its defaults without any YAML."""

    paths: PathsSettings = MISSING
    target: TargetSpec = MISSING
    drafter: DrafterSpec = MISSING
    decoding: DecodingSettings = MISSING
    benchmark: BenchmarkSpec = MISSING
    methods: list[str] = field(default_factory=lambda: list(_default(EvalSettings, "methods")))
    """Drafting methods compared on the same prompts, the first is primary
    (`dflash.methods.METHODS`; dflash and dflash_tree draft with drafter.* at
    decoding.block_size); every other method is configured by its own group."""
    hf_generate: bool = _default(EvalSettings, "hf_generate")
    """Also time the target's model.generate(), the baseline a user would otherwise run."""
    warmup_tokens: int = _default(EvalSettings, "warmup_tokens")
    """Untimed warm-up generation on the first prompt; 0: none."""
    cpu_threads: int | None = None
    """Torch intra-op threads; None: torch's default (the smoke preset uses 1)."""
    sweep: Any = None
    """`+sweep=NAME` (dflash/conf/sweep/): the sweep's own keys, read by dflash.sweep (keys only
    one sweep file reads live under that file's `sweep:` node)."""
    train_seed: int | None = None
    """A label of the evaluated drafter that evaluation sweeps set (dflash/conf/sweep/_eval.yaml,
    *_infer*.yaml): part of its directory name, and read by the tables from results.json."""
    train_block_size: int | None = None
    """A label of the evaluated drafter, as train_seed."""

    def __post_init__(self):
        check_method_names(list(self.methods))
        check_cpu_threads(self.cpu_threads)


EvaluateAppConfig = dataclasses.make_dataclass(
    "EvaluateAppConfig",
    [(name, method.settings, field(default_factory=method.settings)) for name, method in METHODS.items() if method.settings],
    bases=(_EvaluateAppKeys,),
)


@dataclass
class RegenerateRunSettings(RegenerateSettings):
    """The regenerate app's `regenerate` group: `RegenerateSettings` plus output_dir."""

    output_dir: str | None = None
    """Where the shards go (regenerate.yaml: ${data.path}, where training then reads them)."""


@dataclass
class RegenerateAppConfig:
    """`python -m dflash.regenerate` (dflash/conf/regenerate.yaml)."""

    paths: PathsSettings = MISSING
    target: TargetSpec = MISSING
    data: DataSpec = MISSING
    regenerate: RegenerateRunSettings = field(default_factory=RegenerateRunSettings)


@dataclass
class ExportAppConfig:
    """`python -m dflash.export` (dflash/conf/export.yaml)."""

    ckpt: str = MISSING
    """A .ckpt file or a run directory (its checkpoints/last.ckpt)."""
    out: str = MISSING
    """The drafter directory to write."""
    dtype: str | None = None
    """The weight dtype on disk (None: as trained)."""

    def __post_init__(self):
        require(self.out != "", "out", "must be a directory path")
        weight_dtype(self.dtype, "dtype")


@dataclass
class TablesAppConfig:
    """`python -m dflash.tables` (dflash/conf/tables.yaml, which says what each key does)."""

    source: str = "dirs"
    root: str = "artifacts/sweeps"
    project: str = "dflash"
    entity: str | None = None
    groups: list[str] = field(default_factory=list)
    ablations: list[str] = field(default_factory=list)
    out_dir: str = "artifacts/tables"
    formats: list[str] = field(default_factory=lambda: ["md", "tex"])
    plots: bool = True
    metric: str = "pooled"

    def __post_init__(self):
        require(self.source in TABLE_SOURCES, "source", f"unknown {self.source!r}; choose one of {list(TABLE_SOURCES)}")
        check_metric(self.metric)
        if self.source == "dirs":
            require(os.path.isdir(self.root), "root", f"no such directory: {self.root}")


@dataclass
class DemoEvaluationSettings:
    """The demo's stage 4 (dflash/conf/demo.yaml)."""

    humaneval: int = 16
    """Prompts of this family."""
    math: int = 8
    """Prompts of this family."""
    chat: int = 8
    """Prompts of this family."""
    max_new_tokens: int = 128
    """Tokens per prompt."""
    start_s: float = 12.0
    """The reserve per evaluate app for its start."""
    min_prompts: int = 4
    """The plan's floor per family where it cuts the counts to fit the budget."""
    methods: list = field(default_factory=lambda: ["dflash", "dflash_tree"])
    """The drafting methods compared with the autoregressive loop (the evaluate app's
    `methods`; the first is primary)."""
    dflash_tree: TreeSettings = field(default_factory=lambda: TreeSettings(budget=6, lookup_ngram=3, lookup_tokens=7))
    """The evaluate app's `dflash_tree` group where `methods` lists it."""

    def __post_init__(self):
        for key in ("humaneval", "math", "chat", "max_new_tokens", "min_prompts"):
            require(getattr(self, key) >= 1, key, f"must be an integer >= 1, got {getattr(self, key)!r}")
        check_method_names(list(self.methods))


@dataclass
class DemoAppConfig:
    """`python -m dflash.demo` (dflash/conf/demo.yaml, which says what each key does)."""

    paths: PathsSettings = MISSING
    target: TargetSpec = MISSING
    budget_minutes: float = 30.0
    train_minutes: Any = "auto"
    """"auto" | minutes."""
    min_train_minutes: float = 3.0
    margin_s: float = 120.0
    reserve_factor: float = 2.6
    cpu_threads: int = 2
    data: str = MISSING
    data_dtype: str = "auto"
    """"auto" (the faster here of `DEMO_ANSWER_DTYPES`) | a dtype."""
    prompts: Any = "auto"
    """"auto" (what the budget allows) | how many prompts stage 2 answers."""
    min_prompts: int = 256
    data_share: float = 0.6
    train_precision: str = "auto"
    """"auto" (the faster here of `DEMO_PRECISIONS`) | a trainer precision."""
    data_overrides: list[str] = field(default_factory=list)
    regenerate: dict = field(default_factory=dict)
    """Settings of the regenerate app, passed to it as its overrides (it checks them)."""
    train_overrides: list[str] = field(default_factory=list)
    evaluation: DemoEvaluationSettings = field(default_factory=DemoEvaluationSettings)
    eval_overrides: list[str] = field(default_factory=list)

    def __post_init__(self):
        for key in ("budget_minutes", "min_train_minutes", "margin_s", "reserve_factor", "cpu_threads"):
            require(getattr(self, key) > 0, key, f"must be a number > 0, got {getattr(self, key)!r}")
        minutes, prompts = self.train_minutes, self.prompts
        require(
            minutes == "auto" or _number(minutes) > 0,
            "train_minutes",
            f"must be 'auto' (what the budget leaves) or minutes > 0, got {minutes!r}",
        )
        require(
            prompts == "auto" or (isinstance(prompts, int) and _number(prompts) >= 1),
            "prompts",
            f"must be 'auto' (what the budget allows) or a number of prompts >= 1, got {prompts!r}",
        )
        for key, choices in (
            ("data_dtype", ("auto", *DEMO_ANSWER_DTYPES, "float16")),
            ("train_precision", ("auto", *DEMO_PRECISIONS)),
        ):
            require(getattr(self, key) in choices, key, f"must be one of {', '.join(choices)}, got {getattr(self, key)!r}")
        require(self.min_prompts >= 1, "min_prompts", f"must be an integer >= 1, got {self.min_prompts!r}")
        require(0 < self.data_share <= 1, "data_share", f"must be a fraction in (0, 1], got {self.data_share!r}")


def _number(value) -> float:
    """`value` when it is a number (a bool is not), else NaN (no comparison holds)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


@dataclass
class StdlibPromptsSettings:
    """The toy demo's prompts (`dflash.toy.tiny_code_prompts.stdlib_code_prompts`)."""

    num_prompts: int = 1024
    seed: int = 0
    max_chars: int = 1024
    doctest_first: bool = True


@dataclass
class DemoTinyAppConfig:
    """`python -m dflash.demo_tiny` (dflash/conf/demo_tiny.yaml, which says what each key does)."""

    paths: PathsSettings = MISSING
    target: TargetSpec = MISSING
    prompts: StdlibPromptsSettings = field(default_factory=StdlibPromptsSettings)
    regenerate: dict = field(default_factory=dict)
    """`RegenerateSettings` of stage 2 (kept a plain mapping: its keys as written name the data directory)."""
    train_overrides: list[str] = field(default_factory=list)
    eval_overrides: list[str] = field(default_factory=list)

    def __post_init__(self):
        typed(RegenerateSettings, self.regenerate, "regenerate")


# group -> its schema; `method` has one per option (each trained method's `train_settings`).
GROUP_SCHEMAS = {
    "paths": PathsSettings,
    "target": TargetSpec,
    "drafter": DrafterSpec,
    "data": DataSpec,
    "training": TrainingSettings,
    "trainer": TrainerSettings,
    "logger": LoggerSettings,
    "eval": AfterTrainEvalSettings,
    "decoding": DecodingSettings,
    "benchmark": BenchmarkSpec,
    **{name: method.settings for name, method in METHODS.items() if method.settings},
}
METHOD_SCHEMAS = {name: method.train_settings for name, method in trained_methods().items()}
APP_SCHEMAS = {
    "train": TrainAppConfig,
    "evaluate": EvaluateAppConfig,
    "regenerate": RegenerateAppConfig,
    "export": ExportAppConfig,
    "tables": TablesAppConfig,
    "demo": DemoAppConfig,
    "demo_tiny": DemoTinyAppConfig,
}


def register() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent): `_<app>_schema` for the apps'
    primary configs, `<group>/_schema` for each group, `method/_<name>_schema` per method."""
    store = ConfigStore.instance()
    for app, schema in APP_SCHEMAS.items():
        store.store(name=f"_{app}_schema", node=schema)
    for group, schema in GROUP_SCHEMAS.items():
        store.store(group=group, name="_schema", node=schema)
    for name, schema in METHOD_SCHEMAS.items():
        store.store(group="method", name=f"_{name}_schema", node=schema)


register()
