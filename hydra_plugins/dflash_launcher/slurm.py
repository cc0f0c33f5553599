"""`hydra/launcher=slurm`: submitit's SLURM launcher, made resumable like `gpu_pool`.

Two additions to `hydra_submitit_launcher`'s SlurmLauncher:
- grid points whose directory already holds results.json are not submitted again;
- a job that fails writes error.json (exception, traceback, overrides) into its own
  directory, from the SLURM task with rank 0.

Defined only when the `hydra-submitit-launcher` package is installed (the `slurm`
extra); without it, Hydra's plugin scan finds nothing here.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus

from dflash.fileio import write_json
from dflash.sweep.jobs import ERROR_FILE, RESULTS_FILE, is_finished
from hydra_plugins.dflash_launcher.common import job_config, job_output_dir, job_return, sweep_jobs

log = logging.getLogger(__name__)

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:
    SlurmLauncher = None

if SlurmLauncher is not None:

    class ResumableSlurmLauncher(SlurmLauncher):
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            jobs = sweep_jobs(self.hydra_context, self.config, job_overrides, initial_job_idx)
            todo = [job for job, _ in jobs if not is_finished(job.output_dir, RESULTS_FILE)]
            log.info("Submitting %d of %d jobs (%d already finished)", len(todo), len(jobs), len(jobs) - len(todo))
            submitted = iter(super().launch([job.overrides for job in todo], initial_job_idx) if todo else [])
            finished = {id(job) for job, _ in jobs} - {id(job) for job in todo}
            return [
                job_return(job, config, JobStatus.COMPLETED) if id(job) in finished else next(submitted) for job, config in jobs
            ]

        def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state) -> JobReturn:
            error_path = None
            if os.environ.get("SLURM_PROCID", "0") == "0":
                config = job_config(self.hydra_context, self.config, sweep_overrides, job_num)
                error_path = os.path.join(job_output_dir(config), ERROR_FILE)
                if os.path.exists(error_path):  # left by an earlier attempt
                    os.remove(error_path)
            try:
                ret = super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
            except SystemExit as exit_:  # the apps exit with status 2 on a config error
                if error_path is not None and exit_.code not in (0, None):
                    _write_error(error_path, sweep_overrides, f"exited with status {exit_.code} (see the job's SLURM log)", None)
                raise
            if error_path is not None and ret.status == JobStatus.FAILED:
                error = ret._return_value
                trace = "".join(traceback.format_exception(error))
                _write_error(error_path, sweep_overrides, f"{type(error).__name__}: {error}", trace)
            return ret


def _write_error(path: str, overrides, exception: str, trace: str | None) -> None:
    record = {
        "status": "failed",
        "exception": exception,
        "traceback": trace,
        "overrides": list(overrides),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    write_json(path, record, indent=2)
