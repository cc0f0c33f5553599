"""The resumable SLURM launcher (hydra/launcher=slurm): config, skipping, error records.

Submission itself is submitit's; here its parent class is replaced by a recorder.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `slurm` extra is not installed")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.utils import JobReturn, JobStatus  # noqa: E402

import dflash.cli  # noqa: E402, F401 - registers the config schemas
import hydra_plugins.dflash_launcher.slurm as slurm  # noqa: E402
from dflash.sweep.jobs import SweepJob  # noqa: E402
from helpers import REPO  # noqa: E402

CONF = REPO / "dflash" / "conf"


@pytest.mark.parametrize(
    "app, sweep",
    [
        ("train", ["+sweep=depth"]),
        ("train", ["+sweep=main"]),
        ("train", ["+sweep=main", "sweep/scale=cpu"]),
        ("train", ["+sweep=depth", "sweep/scale=cpu"]),
        ("evaluate", ["+sweep=block_size_infer", "sweep/eval_scale=cpu"]),
    ],
)
def test_every_kind_of_sweep_can_switch_to_slurm(app, sweep):
    # Sweeps pick gpu_pool variants as whole launcher options, never gpu_pool-only keys,
    # so replacing the launcher on the command line leaves no key submitit lacks.
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=app):
        cfg = compose(app, overrides=[*sweep, "hydra/launcher=slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.dflash_launcher.slurm.ResumableSlurmLauncher"
    assert launcher.gpus_per_node == 1 and launcher.submitit_folder  # submitit's own keys are there


def test_finished_points_are_not_submitted_and_failures_leave_error_json(tmp_path, monkeypatch):
    jobs = []
    for index, layers in enumerate((1, 3, 5)):
        job_dir = tmp_path / f"drafter.num_layers={layers}"
        job_dir.mkdir()
        jobs.append((SweepJob(index, [f"drafter.num_layers={layers}"], str(job_dir)), {"job": index}))
    (tmp_path / "drafter.num_layers=3" / "results.json").write_text("{}")
    submitted = []

    def fake_submit(self, job_overrides, initial_job_idx):
        submitted.extend(job_overrides)
        return [JobReturn(overrides=o, status=JobStatus.COMPLETED) for o in job_overrides]

    monkeypatch.setattr(slurm, "sweep_jobs", lambda *args: jobs)
    monkeypatch.setattr(slurm.SlurmLauncher, "launch", fake_submit)
    monkeypatch.setattr(slurm, "job_return", lambda job, config, status: JobReturn(overrides=job.overrides, status=status))
    launcher = slurm.ResumableSlurmLauncher.__new__(slurm.ResumableSlurmLauncher)
    launcher.hydra_context = launcher.config = None
    returns = launcher.launch([job.overrides for job, _ in jobs], 0)
    assert submitted == [["drafter.num_layers=1"], ["drafter.num_layers=5"]]
    assert [r.overrides for r in returns] == [job.overrides for job, _ in jobs]  # sweep order kept

    failed_dir = tmp_path / "drafter.num_layers=5"
    (failed_dir / "error.json").write_text("{}")  # a stale record from an earlier attempt

    def fake_run(self, sweep_overrides, *args):
        assert not (failed_dir / "error.json").exists()  # removed before the job starts
        try:
            raise RuntimeError("NCCL timeout")
        except RuntimeError as err:
            return JobReturn(overrides=sweep_overrides, status=JobStatus.FAILED, _return_value=err)

    monkeypatch.setattr(slurm.SlurmLauncher, "__call__", fake_run)
    monkeypatch.setattr(slurm, "job_config", lambda *args: None)
    monkeypatch.setattr(slurm, "job_output_dir", lambda config: str(failed_dir))
    ret = launcher(["drafter.num_layers=5"], "hydra.sweep.dir", 2, "id", {})
    assert ret.status == JobStatus.FAILED
    record = json.loads((failed_dir / "error.json").read_text())
    assert record["exception"] == "RuntimeError: NCCL timeout" and "raise RuntimeError" in record["traceback"]
