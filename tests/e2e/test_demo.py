"""`make demo` on SmolLM2-135M-Instruct: a shortened demo end to end through a pipe (every
stage's output, the plan stage 1 measured, the report per family, held-out prompts, stage times,
progress lines).

Run once: that a second run skips every stage is tested in process for the demo's own
stages (tests/cli/test_demo.py) and end to end on the toy demo, whose pipeline this one
shares (tests/e2e/test_demo_tiny.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dflash.data.builtin_prompts import regenerated_prompts
from dflash.specs import TargetSpec, load_target
from helpers import REPO

SHARED_ARTIFACTS = os.environ.get("DFLASH_ARTIFACTS", str(REPO / "artifacts"))


QUICK = [
    'data_overrides=["data.sources.0.limit=6","data.sources.1.limit=3","data.sources.2.limit=3","data.val_fraction=0.25"]',
    "regenerate.max_new_tokens=16",
    "regenerate.batch_size=6",
    "train_minutes=0.15",
    "evaluation.humaneval=1",
    "evaluation.math=1",
    "evaluation.chat=1",
    "evaluation.max_new_tokens=12",
    "cpu_threads=1",  # the suite runs one test per core
    'train_overrides=["trainer.val_check_interval=2","checkpoint.every_n_train_steps=2","data.batch_size=2"]',
    'eval_overrides=["warmup_tokens=0"]',
]


def run_demo(artifacts: Path, started: float):
    env = dict(os.environ, DFLASH_ARTIFACTS=str(artifacts), DFLASH_DEMO_STARTED=str(int(started)))
    return subprocess.run([sys.executable, "-m", "dflash.demo", *QUICK], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_shortened_demo_runs_every_stage_and_reports_each_family(tmp_path):
    # The converted target is shared with the other SmolLM2 tests (converted once, read here).
    config = OmegaConf.load(REPO / "dflash" / "conf" / "target" / "smollm2_135m.yaml")
    shared = os.path.join(SHARED_ARTIFACTS, "targets", "smollm2_135m")
    load_target(TargetSpec(path=shared, gguf_file=config.gguf_file, dtype="float32"))
    (tmp_path / "targets").mkdir()
    os.symlink(shared, tmp_path / "targets" / "smollm2_135m")

    first = run_demo(tmp_path, time.time() - 5)
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("demo-smollm2-*")
    assert (run_dir / "drafter" / "model.safetensors").exists()
    summary = json.loads((run_dir / "demo_summary.json").read_text())
    assert list(summary["families"]) == ["humaneval", "math", "chat"] and summary["lossless"] is True
    for family, rows in summary["families"].items():
        results = json.loads((run_dir / "eval" / family / "results.json").read_text())
        assert list(rows) == ["dflash", "dflash_tree"] == list(results["methods"]) and results["method"] == "dflash"
        assert (
            results["methods"]["dflash_tree"]["settings"] | {"budget": 6, "lookup_ngram": 3, "lookup_tokens": 7}
            == results["methods"]["dflash_tree"]["settings"]
        )
        for method, row in rows.items():
            record = results["methods"][method]
            assert row["tau"] == record["tau"] and row["num_prompts"] == 1 and record["lossless"] is True
    assert summary["train_minutes"] == 0.15
    # stage 1 measured both dtypes and both precisions and chose the faster of each, on every prompt
    # (the floor min_prompts is capped at the 12 the data has); the plan is kept for a resumed demo
    plan = summary["plan"]
    for choice, rates in (("data_dtype", "answer_tokens_per_s"), ("precision", "fill_tokens_per_s")):
        measured = plan["measured"][rates]
        assert len(measured) == 2 and plan[choice] == max(measured, key=measured.get), plan
    assert plan["prompts"] == 12 and plan["data_overrides"] == []
    assert [json.loads(path.read_text()) for path in (tmp_path / "demo").glob("plan-*.json")] == [plan]
    assert f"trainer.precision={plan['precision']}" in first.stdout and "expected to finish at" in first.stdout
    times = summary["stage_wall_time_s"]
    assert list(times) == ["install", "target", "data", "train", "evaluate", "total"]
    assert times["install"] >= 4  # DFLASH_DEMO_STARTED was 5 s before the demo started
    # the held-out files hold no training prompt
    (meta_dir,) = (tmp_path / "demo").glob("smollm2-data-*-demo")
    training = regenerated_prompts(str(meta_dir)[: -len("-demo")])
    for family in ("math", "chat"):
        rows = [json.loads(line) for line in (meta_dir / f"heldout_{family}.jsonl").read_text().splitlines()]
        assert len(rows) == 1 and rows[0]["turns"][0] not in training
    log = first.stdout + first.stderr
    assert "autoregressive step" in log and "train: step" in log and "ETA" in log
    assert all(f"  {family:<11}{method:<15}" in first.stdout for family in ("humaneval", "math", "chat")
               for method in ("dflash", "dflash_tree"))  # fmt: skip
