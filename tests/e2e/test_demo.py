"""`make demo` on SmolLM2-135M-Instruct: the budget's arithmetic, held-out evaluation prompts,
and a shortened demo end to end through a pipe (every stage's output, the report per
family, stage times, progress lines), then run again: every stage is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dflash.cli import demo
from dflash.data.builtin_prompts import FAMILIES, heldout_prompts, regenerated_prompts
from dflash.errors import ConfigError
from dflash.specs import TargetSpec, load_target
from helpers import REPO

SHARED_ARTIFACTS = os.environ.get("DFLASH_ARTIFACTS", str(REPO / "artifacts"))


def demo_config(**overrides):
    cfg = OmegaConf.load(REPO / "dflash" / "conf" / "demo.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_auto_training_minutes_are_what_the_budget_leaves_and_kept_on_resume(tmp_path, monkeypatch):
    cfg = demo_config(budget_minutes=30, margin_s=60, reserve_factor=2.0, **{"evaluation.start_s": 10})
    # this process "started" now: the module's import time is the earlier of the two clocks
    # the budget counts from, and a slow suite imports it long before this test runs
    monkeypatch.setattr(demo, "_STARTED", time.time())
    monkeypatch.setenv(demo.STARTED_ENV, str(time.time() - 600))  # 10 minutes spent (install, data)
    forward_s = 0.05
    tokens = (16 + 8 + 8) * 128
    reserve = tokens * forward_s * 2.0 + 3 * 10
    minutes = demo.train_minutes(cfg, str(tmp_path), forward_s)
    assert minutes == pytest.approx((1800 - 600 - reserve - 60) / 60, abs=0.15)
    # a resumed demo trains to the same total, whatever the clock says now
    monkeypatch.setenv(demo.STARTED_ENV, str(time.time() - 1500))
    assert demo.train_minutes(cfg, str(tmp_path), forward_s) == minutes
    # a spent budget still trains the minimum (and says the budget will be exceeded)
    assert demo.train_minutes(cfg, str(tmp_path / "late"), forward_s) == cfg.min_train_minutes
    assert demo.train_minutes(demo_config(train_minutes=7), str(tmp_path / "fixed"), forward_s) == 7


def test_a_bad_start_time_or_setting_is_one_config_error(monkeypatch):
    monkeypatch.setenv(demo.STARTED_ENV, "yesterday")
    with pytest.raises(ConfigError, match=demo.STARTED_ENV):
        demo.check_settings(demo_config())
    monkeypatch.delenv(demo.STARTED_ENV)
    with pytest.raises(ConfigError, match="train_minutes"):
        demo.check_settings(demo_config(train_minutes="soon"))
    with pytest.raises(ConfigError, match="evaluation.math"):
        demo.check_settings(demo_config(**{"evaluation.math": 0}))


@pytest.mark.parametrize("family", ["math", "chat"])
def test_heldout_prompts_are_never_training_prompts(family):
    training = FAMILIES[family](200, 0)
    heldout = heldout_prompts(family, 50, training)
    assert len(heldout) == len(set(heldout)) == 50
    assert not set(heldout) & set(training)
    assert heldout == heldout_prompts(family, 50, training)  # seeded


def test_too_many_heldout_prompts_is_one_config_error():
    with pytest.raises(ConfigError, match="^chat: cannot draw"):  # the held-out chat templates give 150 requests
        heldout_prompts("chat", 5_000, FAMILIES["chat"](200, 0))


QUICK = [
    'data_overrides=["data.sources.0.limit=6","data.sources.1.limit=3","data.sources.2.limit=3","data.val_fraction=0.25"]',
    "regenerate.max_new_tokens=16",
    "regenerate.batch_size=6",
    "train_minutes=0.15",
    "evaluation.humaneval=1",
    "evaluation.math=1",
    "evaluation.chat=1",
    "evaluation.max_new_tokens=12",
    'train_overrides=["trainer.val_check_interval=2","checkpoint.every_n_train_steps=2","data.batch_size=2"]',
    'eval_overrides=["warmup_tokens=0"]',
]


def run_demo(artifacts: Path, started: float):
    env = dict(os.environ, DFLASH_ARTIFACTS=str(artifacts), DFLASH_DEMO_STARTED=str(int(started)))
    return subprocess.run([sys.executable, "-m", "dflash.demo", *QUICK], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_shortened_demo_runs_every_stage_reports_each_family_and_resumes(tmp_path):
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
    for family, row in summary["families"].items():
        results = json.loads((run_dir / "eval" / family / "results.json").read_text())
        assert row["tau"] == results["tau"] and row["num_prompts"] == 1 and results["lossless"] is True
    assert summary["train_minutes"] == 0.15
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
    assert "one-token forward" in log and "train: step" in log and "ETA" in log
    assert all(f"  {family:<11}" in first.stdout for family in ("humaneval", "math", "chat"))

    second = run_demo(tmp_path, time.time())
    assert second.returncode == 0, second.stderr[-3000:]
    for text in ("[2/5] data: done already", "[3/5] train: done already", "humaneval: done already", "chat: done already"):
        assert text in second.stdout, text
