"""Training for a wall-clock budget (`trainer.max_minutes`): it stops there, the learning
rate follows the fraction of the budget spent, and a resumed run keeps what was spent."""

from __future__ import annotations

import time

import pytest
from lightning.pytorch.callbacks import Callback, Timer

from dflash.training.module import warmup_cosine_schedule
from dflash.training.run import run_training
from helpers.training import KillAtStep, Killed, checkpoint, training_job

BUDGET = ("trainer.max_steps=-1", "trainer.max_epochs=null")
STEP_S = 0.25  # each step is slowed to at least this, so the budget, not the machine, sets the count


class SlowSteps(Callback):
    """Makes every step last STEP_S and records (step, learning rate, seconds spent)."""

    def __init__(self):
        self.steps: list[tuple[int, float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(STEP_S)
        timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.steps.append((trainer.global_step, lr, timer.time_elapsed("train")))


def test_the_schedule_follows_the_budget_spent():
    spent = [0.0]
    schedule = warmup_cosine_schedule(None, 0.1, 0.0, lambda: spent[0])
    values = {}
    for fraction in (0.0, 0.05, 0.1, 0.55, 1.0, 1.5):
        spent[0] = fraction
        values[fraction] = schedule(3)
    assert values[0.0] == pytest.approx(0.01) and values[0.05] == pytest.approx(0.5)
    assert values[0.1] == pytest.approx(1.0) and values[0.55] == pytest.approx(0.5)
    assert values[1.0] == pytest.approx(0.0, abs=1e-12) and values[1.5] == pytest.approx(0.0, abs=1e-12)
    # with a step limit too, the further of the two sets the progress
    both = warmup_cosine_schedule(100, 0.1, 0.0, lambda: 0.2)
    assert both(55) == pytest.approx(0.5) and both(10) == pytest.approx(warmup_cosine_schedule(None, 0.1, 0.0, lambda: 0.2)(10))


def test_a_time_budget_ends_training_and_the_schedule(tmp_path):
    budget_s = 3.0
    job = training_job(tmp_path, "budget", 4, *BUDGET, f"trainer.max_minutes={budget_s / 60}", "training.warmup_ratio=0.2")
    slow = SlowSteps()
    outcome = run_training(job, callbacks=[slow])
    steps = [step for step, _, _ in slow.steps]
    assert outcome.global_step == len(steps) and len(steps) <= budget_s / STEP_S + 1
    assert slow.steps[-1][2] >= budget_s  # it stopped because the budget was spent
    peak = max(lr for _, lr, _ in slow.steps)
    assert peak > 0.9 * job.training.learning_rate  # warm-up reached the peak ...
    assert slow.steps[-1][1] < 0.1 * job.training.learning_rate  # ... and the cosine ended near 0


def test_a_resumed_run_spends_only_the_rest_of_the_budget(tmp_path):
    budget_s = 3.0
    job = training_job(
        tmp_path, "budget_killed", 4, *BUDGET, f"trainer.max_minutes={budget_s / 60}", "checkpoint.every_n_train_steps=3"
    )
    with pytest.raises(Killed):
        run_training(job, callbacks=[SlowSteps(), KillAtStep(4)])
    spent_before = checkpoint(job)["callbacks"]
    resumed = SlowSteps()
    outcome = run_training(job, callbacks=[resumed])
    assert outcome.resumed_from is not None
    first_step, _, first_elapsed = resumed.steps[0]
    assert first_step == 4 and first_elapsed >= 3 * STEP_S  # the 3 checkpointed steps' time counts
    # the budget was shared: fewer steps after the resume than a whole budget holds
    assert len(resumed.steps) <= (budget_s - 3 * STEP_S) / STEP_S + 1
    assert any("Timer" in key for key in spent_before)


def test_a_timer_without_a_duration_is_not_a_budget():
    from types import SimpleNamespace

    from dflash.training.module import training_time_fraction

    budget = Timer(duration={"minutes": 5})
    assert training_time_fraction(SimpleNamespace(callbacks=[Timer()], world_size=1)) is None
    fraction = training_time_fraction(SimpleNamespace(callbacks=[Timer(), budget], world_size=1))
    assert fraction is not None and fraction() == pytest.approx(0.0)  # not started: nothing spent
