"""A shortened `make demo-tiny` end to end, its output a pipe as in `make demo-tiny > log`: every
stage's output exists, results are well formed, the log is readable (training progress
lines, each line once, no advertisements), stage times are reported, and a second run
skips every stage."""

import json
import os
import re
import subprocess
import sys

import pytest

QUICK = [
    "target.build.vocab_size=512",
    "target.build.num_layers=6",
    "target.build.hidden_size=32",
    "target.build.num_heads=2",
    "target.build.num_kv_heads=1",
    "target.build.intermediate_size=64",
    "target.build.seq_len=64",
    "target.build.batch_size=2",
    "target.build.max_steps=3",
    "target.build.warmup_steps=1",
    "target.build.val_windows=2",
    "target.build.max_corpus_bytes=150000",
    "prompts.num_prompts=8",
    "regenerate.max_new_tokens=24",
    "regenerate.batch_size=4",
    "train_overrides=["
    + ",".join(
        f"'{o}'"
        for o in [
            "trainer.max_steps=3",
            "trainer.val_check_interval=3",
            "checkpoint.every_n_train_steps=3",
            "drafter.block_size=4",
            "data.val_fraction=0.25",
            "cpu_threads=1",
        ]
    )
    + "]",
    "eval_overrides=["
    + ",".join(
        f"'{o}'"
        for o in [
            "benchmark=humaneval",
            "benchmark.prompt_format=raw",
            "benchmark.max_samples=2",
            "decoding.max_new_tokens=12",
            "warmup_tokens=0",
            "hf_generate=false",
            "cpu_threads=1",
        ]
    )
    + "]",
]


def run_demo(artifacts):
    env = dict(os.environ, DFLASH_ARTIFACTS=str(artifacts))
    return subprocess.run([sys.executable, "-m", "dflash.demo_tiny", *QUICK], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_shortened_demo_runs_every_stage_and_resumes(tmp_path):
    first = run_demo(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    target = tmp_path / "targets" / "tiny_code_demo"
    assert (target / "config.json").exists() and (target / "build_info.json").exists()
    (data_dir,) = (tmp_path / "demo").glob("data-*")
    assert list(data_dir.glob("rows-*.jsonl")) and (data_dir / "manifest.json").exists()
    (run_dir,) = (tmp_path / "runs").glob("demo-*")
    assert (run_dir / "drafter" / "config.json").exists() and (run_dir / "drafter" / "model.safetensors").exists()
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    assert results["benchmark"] == "humaneval" and results["num_prompts"] == 2
    assert results["lossless"] is True and results["tau"] >= 1.0
    assert results["tokens_per_s"]["dflash"] > 0 and results["tokens_per_s"]["autoregressive"] > 0
    assert sum(results["acceptance_histogram"]) > 0
    assert "tau (acceptance length per verify step" in first.stdout and "paper's harness" in first.stdout

    # Stage times: printed at the end and written into the summary with the results.
    summary = json.loads((run_dir / "demo_summary.json").read_text())
    times = summary["stage_wall_time_s"]
    assert list(times) == ["target", "data", "train", "evaluate", "total"]
    assert all(seconds > 0 for seconds in times.values())
    assert abs(times["total"] - sum(times[name] for name in ("target", "data", "train", "evaluate"))) < 0.2
    assert summary["tau"] == results["tau"] and summary["lossless"] is True
    table = first.stdout[first.stdout.index("wall time per stage") :]
    assert all(f"  {name}" in table for name in times)

    # The log of a pipe: progress as lines, every line once, no advertisements.
    log = first.stdout + first.stderr
    assert "train: step 3/3 (100%), loss" in log and "steps/s" in log and "ETA" in log
    assert "target pre-training: step 3/3 (100%)" in log
    assert log.count("GPU available: False") == 1, "a Lightning line printed twice"
    assert not any(line.startswith("INFO: ") for line in log.splitlines()), "Lightning's own console handler is back"
    assert "Tip:" not in log and "litlogger" not in log and "litmodels" not in log
    assert "LeafSpec" not in log
    # 2 regeneration batches: the bar draws when it opens and closes, and once more only per
    # 30 s interval the data stage lasted (a first build of the engine's kernel can take one)
    draws = len(re.findall(r"regenerate:\s+\d+%", log))
    assert 2 <= draws <= 2 + int(times["data"] // 30), f"the regeneration bar drew {draws} times in {times['data']:.0f} s"

    second = run_demo(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "reusing the tiny code LM" in second.stdout
    assert "8 of 8 rows already done" in second.stdout + second.stderr
    assert "[3/5] train: done already" in second.stdout and "[4/5] evaluate: done already" in second.stdout
