"""The Lightning objects of a training run, built from the plain settings
(`dflash.training.settings`): the `Trainer` with its strategy (FSDP: `dflash.training.fsdp`)
and the loggers, with the wandb run id kept in the run directory and the exported drafter
logged as a wandb artifact. The run driver (`dflash.training.run`) calls these.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import uuid

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from dflash.errors import ConfigError
from dflash.fileio import write_text
from dflash.layout import WANDB_ID_FILE
from dflash.training.checkpoints import KeepPreviousCheckpointIO
from dflash.training.settings import FSDP_STATE_DICT_TYPE, LoggerSettings, TrainerSettings

log = logging.getLogger(__name__)


def build_trainer(settings: TrainerSettings, output_dir: str, loggers: list, callbacks: list[Callback]) -> L.Trainer:
    """A `lightning.Trainer` from the `trainer` settings (strategy objects built here)."""
    try:
        return L.Trainer(
            accelerator=settings.accelerator,
            devices=settings.devices,
            num_nodes=settings.num_nodes,
            strategy=_strategy(settings),
            precision=settings.precision,
            max_epochs=settings.max_epochs,
            max_steps=settings.max_steps,
            max_time=None if settings.max_minutes is None else datetime.timedelta(minutes=settings.max_minutes),
            gradient_clip_val=settings.gradient_clip_val,
            accumulate_grad_batches=settings.accumulate_grad_batches,
            log_every_n_steps=settings.log_every_n_steps,
            val_check_interval=settings.val_check_interval,
            check_val_every_n_epoch=settings.check_val_every_n_epoch,
            limit_val_batches=settings.limit_val_batches,
            num_sanity_val_steps=settings.num_sanity_val_steps,
            enable_progress_bar=settings.enable_progress_bar,
            default_root_dir=output_dir,
            logger=loggers or False,
            callbacks=callbacks,
            plugins=[KeepPreviousCheckpointIO()],
            use_distributed_sampler=True,
        )
    except (ValueError, TypeError, RuntimeError, MisconfigurationException) as err:  # Lightning's checks of devices etc.
        message = " ".join(str(err).split())
        raise ConfigError("trainer", message) from None


def _strategy(settings: TrainerSettings):
    if settings.strategy != "fsdp":
        return settings.strategy
    from dflash.drafter.model import DrafterLayer
    from dflash.training.fsdp import DrafterFSDPStrategy

    options = settings.fsdp or {}
    return DrafterFSDPStrategy(
        auto_wrap_policy={DrafterLayer} if options.get("wrap_drafter_layers", True) else None,
        sharding_strategy=options.get("sharding_strategy", "FULL_SHARD"),
        state_dict_type=FSDP_STATE_DICT_TYPE,
    )


def build_loggers(settings: LoggerSettings, output_dir: str, config: dict) -> list:
    """The Lightning loggers for `settings.kind`, with the resolved run config logged."""
    if settings.kind == "none":
        return []
    if settings.kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(save_dir=output_dir, name="csv")
    elif settings.kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        logger = TensorBoardLogger(save_dir=output_dir, name="tensorboard", default_hp_metric=False)
    else:
        logger = _wandb_logger(settings, output_dir)
    logger.log_hyperparams(config)
    return [logger]


def _wandb_logger(settings: LoggerSettings, output_dir: str):
    from lightning.pytorch.loggers import WandbLogger

    # The run id lives in the run directory, so a resumed run continues the same wandb run.
    id_path = os.path.join(output_dir, WANDB_ID_FILE)
    if os.path.isfile(id_path):
        with open(id_path) as f:
            run_id = f.read().strip()
    else:
        run_id = uuid.uuid4().hex[:12]
        if rank_zero_only.rank == 0:
            write_text(id_path, run_id)
    return WandbLogger(
        project=settings.project,
        entity=settings.entity,
        group=settings.group,
        tags=list(settings.tags),
        name=settings.name,
        offline=settings.offline,
        save_dir=output_dir,
        id=run_id,
        resume="allow",
    )


def log_drafter_artifact(loggers: list, drafter_dir: str, step: int, run_name: str | None) -> None:
    """Log the exported drafter directory (weights, config, model card) as a wandb artifact
    of type "model", named `drafter-<run name>`, aliased `step-<step>`; nothing without wandb.
    Offline runs keep it in the run's files until `wandb sync`."""
    for logger in loggers:
        if type(logger).__name__ != "WandbLogger" or rank_zero_only.rank != 0:
            continue
        import wandb

        name = "drafter-" + re.sub(r"[^\w.-]", "_", run_name or logger.experiment.id)
        artifact = wandb.Artifact(name=name, type="model", metadata={"global_step": step})
        artifact.add_dir(drafter_dir)
        logger.experiment.log_artifact(artifact, aliases=["latest", f"step-{step}"])
        log.info("drafter logged to wandb as artifact %s", name)


def finish_loggers(loggers: list) -> None:
    """Flush loggers; closes the wandb run so an offline run directory is complete."""
    for logger in loggers:
        logger.save()
        if type(logger).__name__ == "WandbLogger" and rank_zero_only.rank == 0:
            logger.experiment.finish()
