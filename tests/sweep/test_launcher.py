"""The gpu_pool Hydra launcher end to end, on a toy Hydra app and fake GPU ids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import REPO

TOY_APP = textwrap.dedent(
    """
    import json, os, time
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(config_path="conf", config_name="toy", version_base="1.3")
    def main(cfg):
        start = time.time()
        with open(os.path.join(HydraConfig.get().runtime.output_dir, "pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(cfg.duration)
        if cfg.fail:
            raise ValueError(f"job with duration {cfg.duration} fails on purpose")
        record = {"gpus": os.environ["CUDA_VISIBLE_DEVICES"], "start": start, "end": time.time(),
                  "mode": HydraConfig.get().mode.name}
        with open(os.path.join(HydraConfig.get().runtime.output_dir, "results.json"), "w") as f:
            json.dump(record, f)

    if __name__ == "__main__":
        main()
    """
)


def _toy_config(sweep_dir: Path) -> str:
    return textwrap.dedent(
        f"""
        defaults:
          - override hydra/launcher: gpu_pool
          - _self_
        duration: 0.1
        fail: false
        hydra:
          searchpath: [file://{REPO / "dflash" / "conf"}]
          sweep:
            dir: {sweep_dir}
            subdir: ${{hydra.job.override_dirname}}
        """
    )


@pytest.fixture
def toy_app(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "toy.yaml").write_text(_toy_config(tmp_path / "sweep"))
    (tmp_path / "toy_app.py").write_text(TOY_APP)
    return tmp_path


def _command(app_dir: Path, *overrides: str) -> dict:
    # The repo root on PYTHONPATH makes its `hydra_plugins` importable from a script
    # elsewhere (an editable install that lists hydra_plugins does the same).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return dict(args=[sys.executable, str(app_dir / "toy_app.py"), "-m", *overrides], cwd=app_dir, env=env)


def _multirun(app_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(**_command(app_dir, *overrides), capture_output=True, text=True, timeout=120)


def _job_dirs(app_dir: Path) -> dict[str, Path]:
    return {p.name: p for p in (app_dir / "sweep").iterdir() if p.is_dir()}


@pytest.mark.slow
def test_seven_jobs_share_three_fake_gpus_one_job_per_gpu(toy_app):
    durations = "0.9,0.1,0.5,0.2,0.7,0.15,0.3"  # distinct values: one directory each
    run = _multirun(toy_app, f"duration={durations}", "hydra.launcher.gpus=[0,1,2]")
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads((d / "results.json").read_text()) for d in _job_dirs(toy_app).values()]
    assert len(records) == 7
    assert {r["mode"] for r in records} == {"RUN"}  # each job runs alone, not as a multirun
    assert {r["gpus"] for r in records} == {"0", "1", "2"}  # one GPU id each, every GPU used
    for gpu in ("0", "1", "2"):
        spans = sorted((r["start"], r["end"]) for r in records if r["gpus"] == gpu)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, f"two jobs ran on GPU {gpu} at once"


@pytest.mark.slow
def test_a_failed_job_leaves_error_json_the_others_finish_and_a_rerun_skips_finished_points(toy_app):
    first = _multirun(toy_app, "duration=0.1,0.2,0.3", "fail=false", "hydra.launcher.gpus=2")
    assert first.returncode == 0, first.stderr[-3000:]
    second = _multirun(toy_app, "duration=0.1,0.2,0.3", "fail=false,true", "hydra.launcher.gpus=2")
    assert second.returncode != 0  # the sweep reports its failures...
    dirs = _job_dirs(toy_app)
    failed = [name for name in dirs if "fail=true" in name.lower()]
    assert len(dirs) == 6 and len(failed) == 3
    for name in failed:  # ...but every job ran: the failures did not stop the others
        record = json.loads((dirs[name] / "error.json").read_text())
        assert record["exception"].startswith("ValueError: job with duration")
        assert "Traceback (most recent call last)" in record["traceback"]
        assert not (dirs[name] / "results.json").exists()
    # Finished points were skipped by the second sweep: their log holds one attempt.
    for name in set(dirs) - set(failed):
        assert (dirs[name] / "job.log").read_text().count("===== ") == 1
        assert (dirs[name] / ".hydra" / "config.yaml").is_file()
    assert "0 ran, 3 skipped, 3 failed" in second.stdout


@pytest.mark.slow
def test_killing_the_sweep_stops_its_running_jobs(toy_app):
    sweep = subprocess.Popen(
        **_command(toy_app, "duration=60,61,62", "hydra.launcher.gpus=2"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    pid_files = [toy_app / "sweep" / f"duration={d}" / "pid" for d in (60, 61)]
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pid_files):
        assert time.monotonic() < deadline and sweep.poll() is None, "the jobs did not start"
        time.sleep(0.2)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=30) != 0
    for pid_file in pid_files:
        with pytest.raises(ProcessLookupError):  # no job is left running without its sweep
            os.kill(int(pid_file.read_text()), 0)
        record = json.loads((pid_file.parent / "error.json").read_text())
        assert record["exception"] == "killed by SIGTERM"
    assert not (toy_app / "sweep" / "duration=62").exists()  # the waiting job never started
