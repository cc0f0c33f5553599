"""Lightning DDP inside a sweep job must start more ranks of that job, never the sweep again.

A 2-point sweep (dflash/conf/sweep/anchors.yaml at scale cpu, shrunk to seconds) in which each job trains
with DDP on 2 CPU processes, through the gpu_pool launcher, then evaluates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from helpers.apps import SHRUNK_CPU_SWEEP


def _write_conversations(path: Path, count: int) -> None:
    with open(path, "w") as f:
        for i in range(count):
            reply = "".join(f"    return x * {i} + {k}\n" for k in range(12))
            messages = [{"role": "user", "content": f"def f{i}(x):\n"}, {"role": "assistant", "content": reply}]
            f.write(json.dumps({"messages": messages}) + "\n")


@pytest.mark.slow
def test_ddp_jobs_in_a_multirun_create_exactly_their_own_job_dirs(tmp_path):
    from dflash.toy.tiny import save_tiny_target

    artifacts = tmp_path / "artifacts"
    # Built once here: two DDP ranks must not race to create it.
    save_tiny_target(str(artifacts / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)
    data = tmp_path / "chats.jsonl"
    _write_conversations(data, 24)
    command = [
        sys.executable,
        "-m",
        "dflash.train",
        "-m",
        "+sweep=anchors",
        "sweep/scale=cpu",
        f"data.path={data}",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        *SHRUNK_CPU_SWEEP,
    ]
    env = dict(os.environ, DFLASH_ARTIFACTS=str(artifacts))
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    assert sorted(p.name for p in (artifacts / "sweeps").iterdir()) == ["anchors_cpu"]
    sweep_dir = artifacts / "sweeps" / "anchors_cpu"
    job_dirs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(job_dirs) == 2, [p.name for p in job_dirs]
    # Named by the grid values; the test's extra overrides add one shared hash.
    names = {p.name.split("+")[0] for p in job_dirs}
    assert names == {"seed=0,training.anchor_sampling=random", "seed=0,training.anchor_sampling=stride"}
    for job_dir in job_dirs:
        log = (job_dir / "job.log").read_text()
        assert "MEMBER: 2/2" in log, log[-2000:]  # rank 1 ran, as a process of this very job
        results = json.loads((job_dir / "results.json").read_text())
        assert results["config"]["sweep"]["ablation"] == "anchors"
        assert (job_dir / ".hydra" / "config.yaml").is_file() and (job_dir / "drafter" / "config.json").is_file()
    assert not (artifacts / "runs").exists()  # no rank fell back to the single-run directory
    assert not (REPO / "multirun").exists() or not any((REPO / "multirun").rglob("anchors_cpu*"))
