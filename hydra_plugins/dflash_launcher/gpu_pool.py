"""`hydra/launcher=gpu_pool`: run a sweep's jobs on this machine, one job per free GPU.

Each grid point runs as its own subprocess (the same app, in RUN mode, with that
point's overrides and `hydra.run.dir` set to the point's sweep directory) with
`CUDA_VISIBLE_DEVICES` set to the GPU ids of one slot; see `dflash.sweep.pool` for the
scheduling guarantees and `dflash.sweep.jobs` for what a job leaves on disk.
Points whose directory already holds the result file are skipped, so re-running a
sweep runs only what is missing or failed.

Options (dflash/conf/hydra/launcher/gpu_pool.yaml): gpus, gpus_per_job, cpu_jobs,
skip_finished, result_file, log_file.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from dflash.structured import config_key
from dflash.sweep.jobs import LOG_FILE, RESULTS_FILE, JobRunner, app_command, is_finished, job_command
from dflash.sweep.pool import device_slots, parse_gpu_ids, run_in_slots
from hydra_plugins.dflash_launcher.common import SweepJobFailed, job_hydra_overrides, job_return, sweep_jobs

log = logging.getLogger(__name__)


class GpuPoolLauncher(Launcher):
    def __init__(
        self,
        gpus="auto",
        gpus_per_job: int = 1,
        cpu_jobs: int = 1,
        skip_finished: bool = True,
        result_file: str = RESULTS_FILE,
        log_file: str = LOG_FILE,
    ) -> None:
        self.gpus = gpus
        self.gpus_per_job = gpus_per_job
        self.cpu_jobs = cpu_jobs
        self.skip_finished = skip_finished
        self.result_file = result_file
        self.log_file = log_file
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # The task function is not called here: every job is a subprocess running the app.
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        with config_key("hydra.launcher"):  # the launcher's keys: hydra.launcher.gpus, ...
            gpu_ids = parse_gpu_ids(self.gpus)
            slots = device_slots(gpu_ids, self.gpus_per_job, self.cpu_jobs)
        if gpu_ids and len(gpu_ids) % self.gpus_per_job:
            log.warning(
                "%d GPUs do not split into jobs of %d: GPUs %s stay unused",
                len(gpu_ids),
                self.gpus_per_job,
                gpu_ids[len(slots) * self.gpus_per_job :],
            )
        jobs = sweep_jobs(self.hydra_context, self.config, job_overrides, initial_job_idx)
        app, hydra_overrides = app_command(), job_hydra_overrides(self.config)
        for job, _ in jobs:
            job.command = job_command(app, job.overrides, hydra_overrides, job.output_dir)

        todo = [job for job, _ in jobs if not (self.skip_finished and is_finished(job.output_dir, self.result_file))]
        log.info(
            "Sweep of %d jobs (%d already finished, skipped) on %d slots: %s",
            len(jobs),
            len(jobs) - len(todo),
            len(slots),
            ", ".join(slot.describe() for slot in slots),
        )
        runner = JobRunner(log_file=self.log_file, on_event=log.info)
        with _sigterm_as_exit():
            outcomes = {o.job.index: o for o in run_in_slots(todo, slots, runner, on_interrupt=runner.terminate_all)}

        returns, failures = [], []
        for job, config in jobs:
            outcome = outcomes.get(job.index)
            if outcome is None:
                returns.append(job_return(job, config, JobStatus.COMPLETED, value=None))
            elif outcome.status == "completed":
                returns.append(job_return(job, config, JobStatus.COMPLETED, value=outcome.returncode))
            else:
                failures.append(outcome)
                message = f"job {job.describe()} failed: {outcome.error['exception']} (see {job.output_dir}/error.json)"
                returns.append(job_return(job, config, JobStatus.FAILED, value=SweepJobFailed(message)))
        done = sum(o.status == "completed" for o in outcomes.values())
        log.info("Sweep done: %d ran, %d skipped, %d failed", done, len(jobs) - len(todo), len(failures))
        for outcome in failures:
            log.error("  failed %s: %s", outcome.job.describe(), outcome.error["exception"])
        return returns


@contextlib.contextmanager
def _sigterm_as_exit():
    """Turn SIGTERM (kill, scheduler preemption) into SystemExit, so the pool stops its
    jobs instead of leaving them running without a parent."""

    def exit_(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
