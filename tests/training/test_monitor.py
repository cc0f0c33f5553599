"""What a run logs at every log interval besides the loss (dflash.training.monitor and
Lightning's LearningRateMonitor): learning rate, gradient norm, tokens/s, peak memory,
in the csv and the tensorboard logger alike."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from dflash.training.monitor import StepMonitor
from dflash.training.run import run_training
from helpers.training import LEARNING_RATE, MAX_STEPS, training_job

WATCHED = ("train/grad_norm", "train/tokens_per_s", "train/peak_mem_gib", "train/lr/matrices", "train/lr/norms_biases")


def _rows(path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("watched")
    job = training_job(tmp_path, "csv", 16, "logger=csv", "trainer.log_every_n_steps=2", "data.val_fraction=0")
    run_training(job)
    return _rows(f"{job.output_dir}/csv/version_0/metrics.csv")


def test_every_log_step_has_lr_grad_norm_throughput_and_memory(csv_run):
    steps = {}
    for row in csv_run:
        steps.setdefault(int(row["step"]), {}).update(row)
    logged = {step: row for step, row in steps.items() if "train/loss" in row}
    assert sorted(logged) == list(range(1, MAX_STEPS, 2))  # steps 2, 4, ... counted from 0
    for row in logged.values():
        assert set(WATCHED) <= set(row), sorted(row)
        assert float(row["train/grad_norm"]) > 0 and math.isfinite(float(row["train/grad_norm"]))
        assert float(row["train/tokens_per_s"]) > 0 and float(row["train/peak_mem_gib"]) > 0
        assert 0 < float(row["train/lr/matrices"]) <= LEARNING_RATE
        assert row["train/lr/matrices"] == row["train/lr/norms_biases"]
    lrs = [float(logged[step]["train/lr/matrices"]) for step in sorted(logged)]
    assert len(set(lrs)) > 1  # warm-up and cosine move it between logs


def test_grad_norm_is_the_whole_gradients_l2_norm():
    monitor = StepMonitor()
    monitor.count({"attention_mask": torch.tensor([[True, True, False], [True, True, True]])})
    metrics = monitor.measure([torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])], torch.device("cpu"), lambda t: t * 2, False)
    assert metrics["train/grad_norm"] == pytest.approx(5.0)  # one process's gradient: not summed over ranks
    sharded = StepMonitor().measure([torch.tensor([3.0, 4.0])], torch.device("cpu"), lambda t: t * 2, True)
    assert sharded["train/grad_norm"] == pytest.approx(math.sqrt(50.0))  # shards: squares summed over (2) ranks
    assert monitor.tokens == 0 and metrics["train/tokens_per_s"] > 0  # 5 tokens x 2 ranks, then restarted


def test_tensorboard_logger_writes_the_same_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = training_job(tmp_path, "tb", 16, "logger=tensorboard", "trainer.log_every_n_steps=2", "trainer.max_steps=4")
    run_training(job)
    (events,) = (tmp_path / "tb" / "tensorboard" / "version_0").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    scalars = set(accumulator.Tags()["scalars"])
    assert {*WATCHED, "train/loss", "train/tau_sim"} <= scalars
    assert [event.step for event in accumulator.Scalars("train/grad_norm")] == [1, 3]
