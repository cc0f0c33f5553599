"""Hydra-side helpers shared by dflash's launchers: a job's directory, its config, skipping."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from dflash.errors import ConfigError
from dflash.sweep.jobs import SweepJob

log = logging.getLogger(__name__)

# Hydra overrides that only make sense for the sweep itself, not for one job run on its own.
SWEEP_ONLY_HYDRA_KEYS = (
    "hydra.launcher",
    "hydra/launcher",
    "hydra.sweeper",
    "hydra/sweeper",
    "hydra.mode",
    "hydra.sweep.",
    "hydra.run.dir",
    "hydra.job.num",
    "hydra.job.id",
)


def job_config(hydra_context: HydraContext, sweep_config: DictConfig, overrides: Sequence[str], index: int) -> DictConfig:
    """The composed config of job `index` (what Hydra's basic launcher would run)."""
    config = hydra_context.config_loader.load_sweep_config(sweep_config, list(overrides))
    with open_dict(config):
        config.hydra.job.id = index
        config.hydra.job.num = index
    return config


def job_output_dir(config: DictConfig) -> str:
    """Absolute `hydra.sweep.dir/hydra.sweep.subdir` of a job config (as Hydra's run_job computes it)."""
    HydraConfig.instance().set_config(config)
    sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
    subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    return os.path.abspath(os.path.join(sweep_dir, subdir))


def sweep_jobs(
    hydra_context: HydraContext, sweep_config: DictConfig, job_overrides, initial_job_idx: int
) -> list[tuple[SweepJob, DictConfig]]:
    """One `SweepJob` per override list; ConfigError if two jobs would share a directory."""
    jobs = []
    by_dir: dict[str, SweepJob] = {}
    for offset, overrides in enumerate(job_overrides):
        index = initial_job_idx + offset
        config = job_config(hydra_context, sweep_config, overrides, index)
        job = SweepJob(index, list(overrides), job_output_dir(config))
        if job.output_dir in by_dir:
            other = by_dir[job.output_dir]
            raise ConfigError(
                "hydra.sweep.subdir",
                f"jobs {other.describe()!r} and {job.describe()!r} would both write to {job.output_dir}; "
                "make the subdir depend on the swept values (e.g. ${hydra.job.override_dirname})",
            )
        by_dir[job.output_dir] = job
        jobs.append((job, config))
    return jobs


def job_hydra_overrides(sweep_config: DictConfig) -> list[str]:
    """The sweep's command-line Hydra overrides that also apply to each job (verbosity, logging)."""
    overrides = OmegaConf.to_container(sweep_config.hydra.overrides.hydra)
    return [o for o in overrides if not o.lstrip("+~").startswith(SWEEP_ONLY_HYDRA_KEYS)]


def job_return(job: SweepJob, config: DictConfig, status: JobStatus, value=None) -> JobReturn:
    """A JobReturn for Hydra's sweeper (which raises `value` for a failed job)."""
    ret = JobReturn(overrides=list(job.overrides), hydra_cfg=config, working_dir=job.output_dir, status=status)
    ret.task_name = str(config.hydra.job.name)
    ret.return_value = value
    return ret


class SweepJobFailed(RuntimeError):
    """Raised by Hydra's sweeper, after every job has run, for a job that failed."""
