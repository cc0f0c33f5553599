"""`python -m dflash.train`: train a DFlash drafter (config: dflash/conf/train.yaml, named runs:
dflash/conf/experiment/*.yaml, selected with `experiment=NAME`).

The run directory is `${paths.artifacts}/runs/${run_name}`, where `run_name` is derived from the
command line (experiment name + a short hash of the other overrides), not from the clock: the same
command again finds `checkpoints/last.ckpt` there and resumes (`checkpoint.resume=auto`). Set
`run_name=NAME` to pin the directory (e.g. to continue a run with a larger `trainer.max_steps`).

Before Hydra runs, every group is built as its dataclass of the config schema (dflash/schema.py) and
`check_job` checks what needs no model (`dflash.cli.common.run_app`); then, in the Hydra task,
`dflash.training.run.run_training` does the work (Lightning and torch load there, not before).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from dflash.cli.common import CONF_DIR, app_config, exits_on_config_error, resolved_config, run_app, set_cpu_threads
from dflash.errors import require
from dflash.layout import RESULTS_FILE
from dflash.structured import config_key

log = logging.getLogger(__name__)

RUN_NAME_RESOLVER = "dflash_run_name"
LIGHTNING_TIP_PREFIX = "💡 Tip:"  # Lightning's advertisements for its cloud services


def run_name_for(experiment: str | None, overrides: str) -> str:
    """Run directory name: the experiment's name, plus a hash of the other overrides (same command -> same name).

    overrides: Hydra's `job.override_dirname`: the command-line overrides, sorted, without `experiment`
    and the keys that do not change what is trained (`exclude_keys` of dflash/conf/train.yaml).
    """
    base = (experiment or "train").replace("/", "_")
    if not overrides:
        return base
    return f"{base}-{hashlib.sha256(overrides.encode()).hexdigest()[:8]}"


OmegaConf.register_new_resolver(RUN_NAME_RESOLVER, run_name_for, replace=True)


def job_from_config(cfg: DictConfig):
    """The `TrainJob` of a composed `train` config (hydra node removed; `dflash.schema.TrainAppConfig`)."""
    from dflash.training.run import TrainJob

    app = app_config(cfg)
    method, settings = _method(app)
    settings = _seeded(settings, app.seed)
    return TrainJob(
        target=app.target,
        # the drafter's initialisation follows the run's seed unless set on its own: building the
        # drafter re-seeds torch, so a fixed drafter seed would also fix the anchors and data order
        drafter=_seeded(app.drafter, app.seed),
        data=app.data,
        training=app.training,
        trainer=app.trainer,
        output_dir=app.paths.output_dir,
        checkpoint=app.checkpoint,
        logger=app.logger,
        evaluation=_evaluation(app.eval, method, settings),
        tau_real=_tau_real(app.eval, method, settings),
        seed=app.seed,
        config=resolved_config(cfg),
        method=method,
        method_settings=settings,
    )


def check_job(app) -> None:
    """What needs no model, before Hydra runs and again in each job: the training data is there
    (a wrong data.path fails at once), and the trained method's own checks (a drafter directory
    is read now, before the target loads); Muon is refused under FSDP."""
    from dflash.data.sources import check_local_source

    with config_key("training"):
        require(
            app.training.optimizer != "muon" or app.trainer.strategy != "fsdp",
            "optimizer",
            "muon is untested under trainer=fsdp (it needs whole matrices); use trainer=ddp or training.optimizer=adamw",
        )
    check_local_source(app.data.source())
    method, settings = _method(app)
    method.check_training(_seeded(settings, app.seed), _seeded(app.drafter, app.seed), app.data, app.training)


def _seeded(settings, seed: int):
    """`settings` with its `seed` field set to the run's seed when it is None."""
    if dataclasses.is_dataclass(settings) and getattr(settings, "seed", 0) is None:
        return dataclasses.replace(settings, seed=seed)
    return settings


def _method(app):
    """The trained method the `method` group configures (`dflash.methods`) and its `train_settings`."""
    from dflash.methods import METHODS, trained_methods

    name = "dflash" if app.method is None else app.method.name
    choices = sorted(trained_methods())
    require(name in choices, "method", f"unknown method {name!r}; choose one of {choices}")
    method = METHODS[name]
    settings = method.train_settings() if app.method is None else app.method
    require(
        isinstance(settings, method.train_settings),
        "method.name",
        f"{name!r} is not the method this group option configures; pick the method with method={name}",
    )
    return method, settings


def _evaluation(group, method, train_settings):
    """The `eval` group as an `AfterTrainEval` of the trained method, or None when `eval.after_train` is false."""
    from dflash.eval import EvalSettings
    from dflash.eval.after_train import AfterTrainEval

    if not group.after_train:
        return None
    with config_key("eval"):
        settings = EvalSettings(
            decoding=group.decoding,
            chat_template=group.benchmark.chat_template,
            enable_thinking=group.benchmark.enable_thinking,
            hf_generate=group.hf_generate,
            warmup_tokens=group.warmup_tokens,
        )
    return AfterTrainEval(benchmark=group.benchmark, settings=settings, method=method, train_settings=train_settings)


def _tau_real(group, method, train_settings):
    """The `eval.tau_real` block as a `TauRealProbe` of the trained method, or None when it is off."""
    from dflash.eval.tau_real import TauRealProbe

    if not group.tau_real.enabled:
        return None
    return TauRealProbe(settings=group.tau_real, method=method, train_settings=train_settings)


# What Lightning's DDP launcher writes into the parent's environment (and leaves there).
_LAUNCHER_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def single_job_for_ddp_ranks():
    """Inside a Hydra multirun, make this job re-runnable by Lightning's DDP launcher.

    Lightning starts the other local ranks by re-running `sys.argv` with `hydra.run.dir` appended; in a
    multirun both name the whole sweep, so they are replaced by this job's own overrides and output
    directory (the ranks re-create this job in RUN mode). The launcher's environment variables are
    restored afterwards, so the next job does not wait for ranks nobody starts. Outside a multirun
    this does nothing.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    hydra_config = HydraConfig.get()
    if hydra_config.mode != RunMode.MULTIRUN:
        yield
        return
    saved_argv = sys.argv
    saved_environment = {name: os.environ.get(name) for name in _LAUNCHER_ENVIRONMENT}
    sys.argv = [sys.argv[0], *hydra_config.overrides.task]
    with read_write(hydra_config.run):
        hydra_config.run.dir = hydra_config.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = saved_argv
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _reused_cell(cfg: DictConfig, job) -> str | None:
    """In a sweep with `sweep.reuse`: the finished job under the sweeps root whose outputs
    this job copied instead of training (`dflash.training.reuse`), or None."""
    sweep = cfg.get("sweep")
    if not sweep or not sweep.get("reuse", False):
        return None
    from hydra.core.hydra_config import HydraConfig

    from dflash.training.reuse import reuse_finished_cell

    root = os.path.dirname(os.path.abspath(HydraConfig.get().sweep.dir))
    return reuse_finished_cell(root, job.output_dir, job.config)


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.eval import load_benchmark
    from dflash.training.run import run_training

    check_job(app_config(cfg))  # again: each job of a sweep (run_app checked its first)
    job = job_from_config(cfg)
    set_cpu_threads(cfg.cpu_threads)
    quiet_third_party_logs()
    if job.evaluation is not None:
        with config_key("eval.benchmark"):  # a bad benchmark fails now, not after training
            load_benchmark(job.evaluation.benchmark)
    log.info("run directory: %s", job.output_dir)
    twin = _reused_cell(cfg, job)
    if twin is not None:
        print(f"reused the finished job {twin} (the same training and evaluation config)")
        print(f"results: {os.path.join(job.output_dir, RESULTS_FILE)}")
        return
    with single_job_for_ddp_ranks():
        outcome = run_training(job)
    if outcome.drafter_dir is not None:
        print(
            f"trained to global step {outcome.global_step}"
            + (f" (resumed from {outcome.resumed_from})" if outcome.resumed_from else "")
        )
        print(f"drafter: {outcome.drafter_dir}")
        if outcome.results_path is not None:
            print(f"results: {outcome.results_path}")


def quiet_third_party_logs() -> None:
    """Print each Lightning log line once, and without its advertisements (also for `dflash.cli.demo_tiny`,
    whose target pre-trains with Lightning).

    Inside a Hydra app Lightning's own console handler goes, so lines come only through Hydra's
    handlers (console and the run's .log file). Dropped: Lightning's tips, the deprecation warning its
    own code triggers in torch's pytree, and under DDP or FSDP its advice to log `val/...` with
    `sync_dist=True` (every rank logs the global value already: `dflash.training.metrics`).
    """
    import warnings

    import lightning  # noqa: F401 - attaches the handler that is removed below

    if logging.getLogger().hasHandlers():
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            if type(handler) is logging.StreamHandler:
                lightning_logger.removeHandler(handler)
    tips = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_lightning_tips not in tips.filters:
        tips.addFilter(_drop_lightning_tips)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('val[/_].*sync_dist=True")


def _drop_lightning_tips(record) -> bool:
    return not str(record.msg).startswith(LIGHTNING_TIP_PREFIX)


def main() -> None:
    run_app(_hydra_main, "train", output_dirs=("paths.artifacts", "data.cache_dir", "training.target_cache_dir"), check=check_job)
