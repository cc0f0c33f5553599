"""One training run from plain settings (`dflash.training.settings`): checkpoints and resume,
the fit, export of the drafter directory and the optional evaluation after training. The
Trainer, its strategy and the loggers are built by `dflash.training.trainer`.

`python -m dflash.train` (dflash/cli/train.py) fills a `TrainJob` from the Hydra config
and calls `run_training`; nothing here reads Hydra (design.md invariant 22).

Invariants:
- Run directory layout (`output_dir`, names in `dflash.layout`): the checkpoints
  (`dflash.training.checkpoints`), `drafter/` (the exported drafter, with `checkpoint.json`
  naming the checkpoint and step it came from, and a model card rewritten once the
  evaluation after training ran), `results.json` (that evaluation), `tau_curves.png` (with
  `eval.tau_real`), logger files.
- Resume always reads last.ckpt (best.ckpt may be older); export reads best.ckpt when
  `select=best` and one was written, else last.ckpt, and says which in the log.
- One job at a time per run directory: the first process holds `dflash.locks.DirectoryLock`
  on it for the whole run (a second job exits 2 naming the holder; a killed holder's lock
  is taken over).
- `resume="auto"`: training continues from `checkpoints/last.ckpt` with its global step,
  optimizer and scheduler state, so re-running a killed command resumes.
- The frozen target is loaded by every rank on that rank's own device
  (`trainer.strategy.root_device`, known once the Trainer exists), never on cuda:0 by all.
- Export and evaluation run on global rank 0 only; export reads the final checkpoint,
  which is a full (unsharded) state dict under every strategy, FSDP included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint

from dflash.data.config import DataSpec
from dflash.fileio import remove_partial_writes
from dflash.fit_progress import training_progress
from dflash.layout import CHECKPOINT_DIR, DRAFTER_DIR
from dflash.locks import DirectoryLock
from dflash.specs import DrafterSpec, TargetSpec, load_target
from dflash.structured import config_key
from dflash.training.after_train import log_evaluation
from dflash.training.checkpoints import (
    LAST_CHECKPOINT,
    best_checkpointer,
    check_checkpoint_fits,
    is_first_process,
    resume_checkpoint,
    selected_checkpoint,
    write_export_info,
)
from dflash.training.config import TrainingSettings
from dflash.training.model_card import read_results, write_model_card
from dflash.training.module import DrafterTrainingModule
from dflash.training.settings import CheckpointSettings, LoggerSettings, TrainerSettings, check_tau_real
from dflash.training.tau_real import TauRealCallback
from dflash.training.trainer import build_loggers, build_trainer, finish_loggers, log_drafter_artifact

log = logging.getLogger(__name__)


@dataclass
class TrainJob:
    """Everything a training run needs. `config` is the resolved run config, logged as is.

    method: the trained method (`dflash.methods.Method`: `build_objective`, `export`, ...);
    method_settings: its `method` group (`Method.train_settings`; DFlash reads none).
    """

    target: TargetSpec
    drafter: DrafterSpec
    data: DataSpec
    training: TrainingSettings
    trainer: TrainerSettings
    output_dir: str
    method: Any
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    logger: LoggerSettings = field(default_factory=LoggerSettings)
    evaluation: object | None = None  # `dflash.eval.after_train.AfterTrainEval`: `.run(target, drafter_dir, output_dir, config)`
    tau_real: object | None = None  # `dflash.eval.tau_real.TauRealProbe` (`.settings`, `.measure`); None: no val/tau_real
    seed: int = 0
    config: dict = field(default_factory=dict)
    method_settings: object | None = None

    def __post_init__(self):
        settings = None if self.tau_real is None else self.tau_real.settings
        check_tau_real(settings, self.validates, self.checkpoint.monitor, self.checkpoint.select)

    @property
    def validates(self) -> bool:
        """Whether validations run (held-out data and validation batches)."""
        return self.data.val_fraction > 0 and self.trainer.limit_val_batches not in (0, 0.0)


@dataclass
class TrainOutcome:
    """What a run produced (paths are None on ranks other than 0)."""

    global_step: int
    resumed_from: str | None
    checkpoint: str
    drafter_dir: str | None
    results_path: str | None


def run_training(job: TrainJob, callbacks: list[Callback] | tuple = ()) -> TrainOutcome:
    """Train (or resume), save the final checkpoint, export the drafter, optionally evaluate.

    callbacks: extra Lightning callbacks (tests use them to observe ranks).
    """
    output_dir = os.path.abspath(job.output_dir)
    if not is_first_process():
        return _train(job, output_dir, callbacks)
    with DirectoryLock(output_dir, "run_name", "wait for that run to finish, or train under another run_name=NAME"):
        with contextlib.suppress(FileNotFoundError):
            remove_partial_writes(os.path.join(output_dir, CHECKPOINT_DIR))  # killed checkpoint writes
        return _train(job, output_dir, callbacks)


def _train(job: TrainJob, output_dir: str, callbacks: list[Callback] | tuple) -> TrainOutcome:
    from dflash.data.datamodule import DFlashDataModule
    from dflash.training.export import read_checkpoint

    checkpoint_dir = os.path.join(output_dir, CHECKPOINT_DIR)
    with config_key("checkpoint"):
        resume_path = resume_checkpoint(job.checkpoint.resume, checkpoint_dir)
    L.seed_everything(job.seed, workers=True, verbose=False)

    loggers = build_loggers(job.logger, output_dir, job.config)
    checkpointer = ModelCheckpoint(
        dirpath=checkpoint_dir,
        save_last=True,
        save_top_k=0,
        every_n_train_steps=job.checkpoint.every_n_train_steps,
        enable_version_counter=False,
    )
    best = None
    if job.checkpoint.select == "best" and job.validates:
        best = best_checkpointer(checkpoint_dir, job.checkpoint.monitor, job.checkpoint.mode)
    # Progress: Lightning's bar on a terminal, one line every 30 s in logs (dflash.progress).
    show_bar, progress = training_progress(job.trainer.enable_progress_bar)
    trainer_settings = dataclasses.replace(job.trainer, enable_progress_bar=show_bar)
    measured = []
    if job.tau_real is not None and job.tau_real.settings.enabled:
        measured.append(TauRealCallback(job.tau_real, job.method.export, job.checkpoint.torch_export_dtype, output_dir))
    # the learning rate at every log step (train/lr/<param group>); Lightning refuses it without a logger
    watched = [LearningRateMonitor(logging_interval="step")] if loggers else []
    extra = [*measured, *watched, *progress, *callbacks]
    trainer = build_trainer(trainer_settings, output_dir, loggers, [checkpointer, *([best] if best else []), *extra])

    target_spec = dataclasses.replace(job.target, device=str(trainer.strategy.root_device))
    target = load_target(target_spec)
    objective = job.method.build_objective(target, job.method_settings, job.drafter, job.training)
    # recorded as hyper-parameters: the target, the groups that configure the method's drafter, training
    own = {"drafter": job.drafter} if job.method.uses_dflash_drafter else {"method": job.method_settings}
    hparams = {name: dataclasses.asdict(value) for name, value in {"target": target_spec, **own, "training": job.training}.items()}
    module = DrafterTrainingModule(target, objective, job.training, hparams)
    if resume_path is not None:
        key = "run_name" if job.checkpoint.resume == "auto" else "checkpoint.resume"
        check_checkpoint_fits(resume_path, module, key)
    datamodule = DFlashDataModule.from_spec(job.data, module.target.tokenizer)
    cluster = getattr(trainer.strategy, "cluster_environment", None)
    if cluster is None or not cluster.creates_processes_externally:
        # No other rank exists yet: tokenise now, so bad data fails before any process group
        # starts. Under an outside launcher Lightning has local rank 0 prepare, the others wait.
        datamodule.prepare_data()
        datamodule.setup("fit")
    if resume_path is not None:
        log.info("resuming from %s", resume_path)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path)

    final_checkpoint = os.path.join(checkpoint_dir, LAST_CHECKPOINT)
    trainer.save_checkpoint(final_checkpoint)
    drafter_dir = results_path = None
    if trainer.is_global_zero:
        selected = selected_checkpoint(best, final_checkpoint, trainer.global_step)
        export_dtype = job.checkpoint.torch_export_dtype
        drafter_dir = job.method.export(read_checkpoint(selected), os.path.join(output_dir, DRAFTER_DIR), export_dtype)
        log.info("drafter exported to %s", drafter_dir)
        write_export_info(drafter_dir, selected, best, trainer.global_step)
        write_model_card(drafter_dir, job.config)
        if job.evaluation is not None:
            results_path = job.evaluation.run(module.target, drafter_dir, output_dir, job.config)
            log_evaluation(loggers, results_path, trainer.global_step)
            write_model_card(drafter_dir, job.config, read_results(results_path))
        if job.logger.log_drafter:
            log_drafter_artifact(loggers, drafter_dir, trainer.global_step, job.config.get("run_name"))
    finish_loggers(loggers)
    # Lightning leaves the process group up; the next job of a Hydra multirun (same
    # process, new ranks) must not reuse a group whose peers have exited.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return TrainOutcome(trainer.global_step, resume_path, final_checkpoint, drafter_dir, results_path)
