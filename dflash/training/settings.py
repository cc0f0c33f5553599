"""The training app's settings that are plain dataclasses: the `trainer`, `logger` and
`checkpoint` groups and `eval.tau_real`, with their checks. Kept apart from the run driver
(`dflash.training.run`) and the tau_real callback (`dflash.training.tau_real`), which
import Lightning: reading and checking a config imports neither (`dflash.schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash.errors import ConfigError, require

SELECT_CHOICES = ("best", "last")
LOGGER_KINDS = ("csv", "tensorboard", "wandb", "none")
FSDP_STATE_DICT_TYPE = "full"  # export reads one consolidated checkpoint file
FSDP_OPTIONS = ("sharding_strategy", "wrap_drafter_layers")
FSDP_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
FSDP_ACCELERATORS = ("gpu", "cuda", "cpu", "auto")  # dflash.training.fsdp: CUDA as Lightning, the CPU over gloo


@dataclass
class TrainerSettings:
    """The `trainer` config group: arguments of `lightning.Trainer` (see dflash/conf/trainer/*.yaml)."""

    accelerator: str = "cpu"
    devices: Any = 1
    """int | str | list[int] (OmegaConf has no unions with containers)."""
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_epochs: int | None = 6
    """6, the published recipe."""
    max_steps: int = -1
    """> 0 stops after this many optimizer steps (wins over max_epochs)."""
    gradient_clip_val: float | None = 1.0
    """1.0, the published recipe."""
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 10
    """Optimizer steps between train/* metric logs (trainer=gpu sets 50)."""
    val_check_interval: Any = 1.0
    """int | float | None (checked below; OmegaConf unions are fragile): float: fraction of
    an epoch; int: every N training batches."""
    check_val_every_n_epoch: int | None = 1
    """None counts val_check_interval batches across epochs."""
    limit_val_batches: Any = 1.0
    """int | float | None (checked below): share (float) or number (int) of held-out batches
    per validation."""
    num_sanity_val_steps: int = 0
    enable_progress_bar: bool = True
    fsdp: dict | None = None
    """Only with strategy "fsdp": {"sharding_strategy": ..., "wrap_drafter_layers": bool}."""
    max_minutes: float | None = None
    """A wall-clock budget for the fit (Lightning's `max_time`, kept across resumes):
    training stops when it is spent, and the learning-rate schedule follows the fraction
    spent (`dflash.training.module.warmup_cosine_schedule`). With max_steps too, the first
    limit reached ends training."""

    def __post_init__(self):
        devices = self.devices
        require(
            isinstance(devices, (int, str, list, tuple)) and not isinstance(devices, bool),
            "devices",
            f"expected a number of devices, 'auto' or a list of device indices, got {devices!r}",
        )
        for name in ("val_check_interval", "limit_val_batches"):
            value = getattr(self, name)
            require(
                value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)),
                name,
                f"expected a number (float: a fraction, int: a count) or null, got {value!r}",
            )
        require(
            self.max_minutes is None or (not isinstance(self.max_minutes, bool) and self.max_minutes > 0),
            "max_minutes",
            f"must be a number of minutes > 0 (null: no time budget), got {self.max_minutes!r}",
        )
        require(
            self.max_steps > 0 or (self.max_epochs is not None and self.max_epochs > 0) or self.max_minutes is not None,
            "max_steps",
            "set trainer.max_steps > 0, trainer.max_epochs > 0 or trainer.max_minutes: the cosine schedule needs a finite length",
        )
        require(self.accumulate_grad_batches >= 1, "accumulate_grad_batches", f"must be >= 1, got {self.accumulate_grad_batches}")
        require(self.log_every_n_steps >= 1, "log_every_n_steps", f"must be >= 1, got {self.log_every_n_steps}")
        require(self.num_nodes >= 1, "num_nodes", f"must be >= 1, got {self.num_nodes}")
        require(
            self.strategy != "fsdp" or self.accelerator in FSDP_ACCELERATORS,
            "accelerator",
            f"trainer=fsdp runs on CUDA GPUs (gpu, cuda) or on the CPU (cpu), got {self.accelerator!r}",
        )
        require(
            self.fsdp is None or self.strategy == "fsdp",
            "fsdp",
            f"FSDP options need trainer.strategy=fsdp (use trainer=fsdp), got strategy {self.strategy!r}",
        )
        unknown = sorted(set(self.fsdp or {}) - set(FSDP_OPTIONS))
        require(not unknown, f"fsdp.{unknown[0] if unknown else ''}", f"unknown key; valid keys: {list(FSDP_OPTIONS)}")
        sharding = (self.fsdp or {}).get("sharding_strategy", "FULL_SHARD")
        require(sharding in FSDP_SHARDING, "fsdp.sharding_strategy", f"unknown {sharding!r}; choose one of {list(FSDP_SHARDING)}")


@dataclass
class LoggerSettings:
    """The `logger` config group."""

    kind: str = "csv"
    """"csv" (default), "tensorboard", "wandb" or "none"."""
    # wandb only, from here on
    project: str = "dflash"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    name: str | None = None
    offline: bool = False
    """Or WANDB_MODE=offline."""
    log_drafter: bool = True
    """The exported drafter directory as a wandb artifact of type "model"."""

    def __post_init__(self):
        require(self.kind in LOGGER_KINDS, "kind", f"unknown {self.kind!r}; choose one of {list(LOGGER_KINDS)}")


@dataclass
class CheckpointSettings:
    """The `checkpoint` config group."""

    every_n_train_steps: int = 1000
    """Refresh `checkpoints/last.ckpt` this often (optimizer steps)."""
    resume: str = "auto"
    """"auto" (continue from last.ckpt when it exists), "never", or a .ckpt path."""
    export_dtype: str | None = None
    """Weight dtype of the exported drafter (None: the training dtype)."""
    select: str = "best"
    """Which checkpoint the drafter is exported from: "best" (the best validation `monitor`
    value; the last one when no validation ran) or "last"."""
    monitor: str = "val/tau_sim"
    """The logged validation metric that ranks checkpoints ("val/tau_sim", higher is better;
    e.g. "val/loss" with mode "min"; "val/tau_real", the real loop's tau, needs
    `eval.tau_real.every_n_validations=1`)."""
    mode: str = "max"
    """With `monitor`: "max" (higher is better, as val/tau_sim) or "min" (as val/loss)."""

    def __post_init__(self):
        require(self.every_n_train_steps >= 1, "every_n_train_steps", f"must be >= 1, got {self.every_n_train_steps}")
        weight_dtype(self.export_dtype, "export_dtype")
        require(self.select in SELECT_CHOICES, "select", f"unknown {self.select!r}; choose one of {list(SELECT_CHOICES)}")
        require(self.mode in ("max", "min"), "mode", f"unknown {self.mode!r}; choose max (higher is better) or min")
        require(
            self.monitor.startswith("val/"),
            "monitor",
            f"{self.monitor!r} is not a validation metric; use one the validation logs, e.g. val/tau_sim, val/loss or val/acc_01",
        )

    @property
    def torch_export_dtype(self):
        """`export_dtype` as a torch dtype (None: the training dtype), checked above."""
        return weight_dtype(self.export_dtype, "export_dtype")


KEY = "eval.tau_real"


@dataclass
class TauRealSettings:
    """The `eval.tau_real` block: the real loop's tau on held-out prompts while training."""

    every_n_validations: int | None = None
    """None: off; k: decode at every k-th validation and at the end of training
    (k x trainer.val_check_interval training batches apart)."""
    num_prompts: int = 8
    """Held-out prompts decoded each time (fewer when the validation split is smaller)."""
    max_new_tokens: int = 64
    """Tokens generated per prompt (the target's greedy output is computed once, at the first
    evaluation, and reused)."""

    def __post_init__(self):
        k = self.every_n_validations
        require(k is None or k >= 1, "every_n_validations", f"must be >= 1 (null: off), got {k}")
        require(self.num_prompts >= 1, "num_prompts", f"must be >= 1, got {self.num_prompts}")
        require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")

    @property
    def enabled(self) -> bool:
        return self.every_n_validations is not None


def check_tau_real(settings: TauRealSettings | None, validates: bool, monitor: str, select: str) -> None:
    """One ConfigError before any model loads: the evaluation on without validations to run
    at, or `checkpoint.monitor=val/tau_real` without a tau_real at every validation."""
    on = settings is not None and settings.enabled
    require(
        not on or validates,
        f"{KEY}.every_n_validations",
        "decodes held-out prompts at validations, and this run has none; set data.val_fraction > 0 "
        "(and trainer.limit_val_batches != 0), or leave it null",
    )
    if monitor != "val/tau_real" or select != "best":
        return
    require(
        on,
        "checkpoint.monitor",
        f"val/tau_real is logged only by the real-loop evaluation, which is off; set {KEY}.every_n_validations=1 "
        "or monitor val/tau_sim",
    )
    require(
        settings.every_n_validations == 1,
        "checkpoint.monitor",
        f"val/tau_real is measured only every {settings.every_n_validations} validations "
        f"({KEY}.every_n_validations={settings.every_n_validations}), but best.ckpt is chosen at every validation; "
        f"set {KEY}.every_n_validations=1",
    )


def weight_dtype(name: str | None, key: str):
    """torch dtype for a dtype name of the config (None stays None: keep the training dtype)."""
    if name is None:
        return None
    import torch

    from dflash.target.model import resolve_dtype

    try:
        dtype = resolve_dtype(name)
    except ConfigError:
        dtype = None
    require(isinstance(dtype, torch.dtype), key, f"unknown dtype {name!r}; choose one of float32, bfloat16, float16 or null")
    return dtype
