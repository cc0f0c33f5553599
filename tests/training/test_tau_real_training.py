"""The real loop's tau while training (`eval.tau_real`, dflash/training/tau_real.py): logged
at the scheduled validations and at the end as another program reads metrics.csv, equal
to the standalone evaluator's tau on the exported drafter, able to rank checkpoints,
plotted, and without effect on what is trained.

Data: a random tiny target's own greedy answers (random models loop, so a drafter learns
them in a few dozen steps and tau_real moves away from 1)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash.data.datamodule import DFlashDataModule
from dflash.data.regenerate import RegenerateSettings, regenerate
from dflash.data.tokenize import TokenizedRows
from dflash.drafter import load_drafter
from dflash.errors import ConfigError
from dflash.eval import DecodingSettings, EvalSettings, Sample, evaluate
from dflash.layout import TAU_CURVES
from dflash.specs import TargetSpec, load_target
from dflash.toy.tiny import save_tiny_target
from dflash.training.run import run_training
from dflash.training.tau_real import TauRealSettings, check_tau_real, held_out_prompts
from helpers.training import checkpoint, training_job

MAX_NEW_TOKENS = 24
TAU_REAL = ["eval.tau_real.every_n_validations=1", f"eval.tau_real.max_new_tokens={MAX_NEW_TOKENS}", "eval.tau_real.num_prompts=6"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The tiny target where the tiny recipe looks for it, and its greedy answers to 32 prompts."""
    root = tmp_path_factory.mktemp("tau_real")
    target_dir = root / "artifacts" / "targets" / "tiny_qwen3_random"
    save_tiny_target(str(target_dir), arch="qwen3", seed=0)
    target = load_target(TargetSpec(path=str(target_dir)))
    rows = [{"messages": [{"role": "user", "content": f"q{i} " + "abcdefgh"[i % 8] * (i % 5 + 1)}]} for i in range(32)]
    regenerate(target, rows, str(root / "answers"), RegenerateSettings(batch_size=16, max_new_tokens=48), progress=False)
    return root


def _job(workspace: Path, tmp_path: Path, name: str, *overrides: str):
    common = [
        f"data.path={workspace / 'answers'}",
        "data.val_fraction=0.25",
        "drafter.block_size=4",
        "training.learning_rate=1e-2",
        "logger=csv",
        f"target.path={workspace / 'artifacts' / 'targets' / 'tiny_qwen3_random'}",
    ]
    return training_job(tmp_path, name, 4, *common, *overrides)  # the 4 conversations it writes are not read


def _logged(run_dir: str) -> list[dict]:
    """metrics.csv of the run's only logger version, as rows of floats (empty cells left out)."""
    (path,) = Path(run_dir).glob("csv/version_*/metrics.csv")
    with open(path, newline="") as f:
        return [{key: float(value) for key, value in row.items() if value != ""} for row in csv.DictReader(f)]


def _series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), row[key]) for row in rows if key in row]


def test_logged_at_every_kth_validation_and_at_the_end(workspace, tmp_path):
    # validations after 4, 8 and 12 optimizer steps; every 2nd decodes (8); the end (14) too
    job = _job(
        workspace, tmp_path, "every_2nd", *TAU_REAL, "eval.tau_real.every_n_validations=2",
        "trainer.max_steps=14", "trainer.val_check_interval=4", "checkpoint.every_n_train_steps=20",
    )  # fmt: skip
    run_training(job)
    rows = _logged(job.output_dir)
    # Lightning writes a validation's rows at step = optimizer steps done - 1; the end's rows follow suit
    assert [step for step, _ in _series(rows, "val/tau_sim")] == [3, 7, 11]
    real = _series(rows, "val/tau_real")
    assert [step for step, _ in real] == [7, 13]
    assert [value for _, value in _series(rows, "val/tau_real_lossless")] == [1.0, 1.0]
    assert all(value > 0 for _, value in _series(rows, "val/tau_real_seconds"))
    assert real[-1][1] > 1.2, "the drafter should have learnt the target's loops by now"
    assert Path(job.output_dir, TAU_CURVES).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = next(state for key, state in checkpoint(job)["callbacks"].items() if key == "RealTauCallback")["history"]
    assert [(h["step"], h["tau_real"] is not None) for h in history] == [(4, False), (8, True), (12, False), (14, True)]
    assert [h["tau_real"] for h in history if h["tau_real"] is not None] == [value for _, value in real]


def test_equals_the_evaluator_on_the_exported_drafter(workspace, tmp_path):
    job = _job(
        workspace, tmp_path, "equal", *TAU_REAL, "checkpoint.select=last",
        "trainer.max_steps=30", "trainer.val_check_interval=20", "checkpoint.every_n_train_steps=30",
    )  # fmt: skip
    outcome = run_training(job)
    final = _series(_logged(job.output_dir), "val/tau_real")[-1]
    assert final[0] == outcome.global_step - 1 == 29  # the end's own evaluation: no validation at step 30

    # The same held-out prompts as text, through the standalone evaluator.
    target = load_target(job.target)
    data = DFlashDataModule.from_spec(job.data, target.tokenizer)
    data.setup("fit")
    prompts = held_out_prompts(data.rows, data.val_set.indices, 6)
    texts = [target.tokenizer.decode(ids[0], skip_special_tokens=True) for ids in prompts]
    assert [target.tokenizer(text)["input_ids"] for text in texts] == [ids[0].tolist() for ids in prompts]
    drafter = load_drafter(outcome.drafter_dir, device=target.device, dtype=target.dtype)
    settings = EvalSettings(decoding=DecodingSettings(max_new_tokens=MAX_NEW_TOKENS), hf_generate=False, warmup_tokens=0)
    results = evaluate(target, drafter, [Sample(turns=[t], index=i) for i, t in enumerate(texts)], settings, progress=False)
    assert results.lossless and results.tau > 1.2
    assert results.tau == final[1]


def test_monitor_tau_real_picks_the_best_checkpoint_by_it(workspace, tmp_path):
    job = _job(
        workspace, tmp_path, "monitor", *TAU_REAL, "checkpoint.monitor=val/tau_real",
        "trainer.max_steps=15", "trainer.val_check_interval=3", "checkpoint.every_n_train_steps=15",
    )  # fmt: skip
    run_training(job)
    validations = _series(_logged(job.output_dir), "val/tau_real")  # the last validation measured the end
    assert [step for step, _ in validations] == [2, 5, 8, 11, 14]
    best_step, best = max(validations, key=lambda point: (point[1], -point[0]))  # ties: the first one is kept
    info = json.loads(Path(job.output_dir, "drafter", "checkpoint.json").read_text())
    assert (info["checkpoint"], info["monitor"]) == ("best.ckpt", "val/tau_real")
    assert (info["global_step"], info["score"]) == (best_step + 1, pytest.approx(best))


def test_training_is_the_same_with_the_evaluation_on_or_off(workspace, tmp_path):
    steps = ["trainer.max_steps=6", "trainer.val_check_interval=2", "checkpoint.every_n_train_steps=6"]
    jobs = [_job(workspace, tmp_path, name, *steps, *extra) for name, extra in (("off", []), ("on", TAU_REAL))]
    for job in jobs:
        run_training(job)
    off, on = (checkpoint(job)["state_dict"] for job in jobs)
    assert "RealTauCallback" in checkpoint(jobs[1])["callbacks"]
    assert off.keys() == on.keys() and all(torch.equal(off[name], on[name]) for name in off)


def test_config_errors_are_one_line_naming_the_key():
    on, every_2nd = TauRealSettings(every_n_validations=1), TauRealSettings(every_n_validations=2)
    cases = [
        ((None, True, "val/tau_real", "best"), "checkpoint.monitor", "which is off"),
        ((every_2nd, True, "val/tau_real", "best"), "checkpoint.monitor", "only every 2 validations"),
        ((on, False, "val/tau_sim", "best"), "eval.tau_real.every_n_validations", "this run has none"),
    ]
    for args, key, words in cases:
        with pytest.raises(ConfigError) as error:
            check_tau_real(*args)
        assert error.value.key == key and words in str(error.value) and "\n" not in str(error.value)
    check_tau_real(every_2nd, True, "val/tau_real", "last")  # select=last never reads the monitor
    check_tau_real(on, True, "val/tau_real", "best")
    with pytest.raises(ConfigError, match="num_prompts"):
        TauRealSettings(num_prompts=0)


def test_held_out_prompts_are_spread_and_end_before_the_response():
    # five rows: prompt lengths 1..5, then two response tokens (loss mask 1) each
    ids, mask, offsets = [], [], [0]
    for row in range(5):
        ids += [10 * row + i for i in range(row + 1)] + [99, 98]
        mask += [0] * (row + 1) + [1, 1]
        offsets.append(len(ids))
    rows = TokenizedRows(np.array(ids, np.int32), np.array(mask, np.uint8), np.array(offsets), np.arange(5), 5)
    prompts = held_out_prompts(rows, np.array([0, 1, 2, 3, 4]), 3)
    assert [p.tolist() for p in prompts] == [[[0]], [[20, 21, 22]], [[40, 41, 42, 43, 44]]]
    assert len(held_out_prompts(rows, np.array([1, 3]), 8)) == 2


def test_eagle3_runs_are_measured_with_their_own_drafter(workspace, tmp_path):
    job = _job(
        workspace, tmp_path, "eagle3", "method=eagle3", "method.ttt_length=3", *TAU_REAL,
        "trainer.max_steps=4", "trainer.val_check_interval=2", "checkpoint.every_n_train_steps=4",
    )  # fmt: skip
    run_training(job)
    rows = _logged(job.output_dir)
    assert [step for step, _ in _series(rows, "val/tau_real")] == [1, 3]
    assert [value for _, value in _series(rows, "val/tau_real_lossless")] == [1.0, 1.0]
    assert all(1.0 <= value <= 4.0 for _, value in _series(rows, "val/tau_real"))  # chains of 3 drafts + the bonus token
