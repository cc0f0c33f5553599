"""Two ablation sweeps that share their base cell train it once: the second copies the first's
finished job (dflash/training/reuse.py), and both tables show it.

The anchors sweep (scale cpu, shrunk to seconds, one grid point: random anchors) trains the
base drafter; the target-context sweep's point with target features on is the same training
under another sweep name, so it is copied, not trained; its point without them trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dflash.reports import build_tables, collect_runs
from helpers import REPO
from helpers.apps import SHRUNK_CPU_SWEEP, write_conversations


@pytest.mark.slow
def test_a_cell_two_sweeps_share_is_trained_once_and_shows_in_both_tables(tmp_path):
    from dflash.toy.tiny import save_tiny_target

    artifacts = tmp_path / "artifacts"
    save_tiny_target(str(artifacts / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)
    data = tmp_path / "chats.jsonl"
    write_conversations(data, 16)
    env = dict(os.environ, DFLASH_ARTIFACTS=str(artifacts), OMP_NUM_THREADS="1")

    def sweep(name: str, point: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "dflash.train", "-m", f"+sweep={name}", "sweep/scale=cpu", f"data.path={data}", point]
        run = subprocess.run([*command, *SHRUNK_CPU_SWEEP], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run

    sweep("anchors", "training.anchor_sampling=random")
    sweep("target_context", "drafter.use_target_features=true,false")
    (trained,) = (artifacts / "sweeps" / "anchors_cpu").glob("*random*")
    copied, standalone = sorted((artifacts / "sweeps" / "target_context_cpu").glob("*use_target_features*"), reverse=True)
    assert "use_target_features=true" in copied.name.lower() and "use_target_features=false" in standalone.name.lower()

    source = json.loads((copied / "reused_from.json").read_text())
    assert os.path.samefile(source["job"], trained)
    assert "reused the finished job" in (copied / "job.log").read_text()
    assert not (copied / "checkpoints").exists() and (copied / "drafter" / "config.json").is_file()
    assert not (standalone / "reused_from.json").exists() and (standalone / "checkpoints").is_dir()  # trained
    results = json.loads((copied / "results.json").read_text())
    original = json.loads((trained / "results.json").read_text())
    assert results["tau"] == original["tau"] and results["config"]["sweep"]["ablation"] == "target_context"

    tables = {t.ablation: t for t in build_tables(collect_runs(str(artifacts / "sweeps")))}
    for ablation in ("anchors", "target_context"):
        taus = [c.values for key, c in tables[ablation].cells.items() if key[2] == "tau" and c.values]
        assert [original["tau"]] in taus, ablation
