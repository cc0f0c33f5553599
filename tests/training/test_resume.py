"""Resuming a killed training run (`checkpoint.resume`), in process through `run_training`.

A run is "killed" by a callback that raises once the checkpoint of step KILLED_AFTER is
on disk and a later step has been trained (that work is lost, as in a real kill); the
same job run again resumes from `checkpoints/last.ckpt`.

When a resumed run can equal an uninterrupted one: only when the data it trains on
after the resume does not depend on where it was killed. Two things do:
- batch order: the training DataLoader is a plain shuffled DataLoader, which Lightning
  cannot restore mid-epoch (it is not `Stateful`): the resumed epoch starts a fresh,
  differently shuffled iterator (Lightning warns "dataloader is not resumable");
- anchors: sampled from the global torch RNG, which `seed_everything` re-seeds when the
  process starts and no checkpoint stores.
With one training sequence (one batch per epoch) and every valid position taken as an
anchor, neither matters, and the resumed run must equal the uninterrupted one bit for bit:
weights, Adam moments and learning rate. With several shuffled batches the tests check
what still holds: the resumed run starts from the checkpoint's weights and optimizer
state, runs only the missing steps and ends on the uninterrupted schedule's learning rate.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from dflash.layout import CHECKPOINT_DIR
from dflash.training.checkpoints import LAST_CHECKPOINT
from dflash.training.module import warmup_cosine_schedule
from dflash.training.run import run_training
from helpers.training import LEARNING_RATE, MAX_STEPS, KillAtStep, Killed, checkpoint, training_job

KILLED_AFTER = 3  # the step of the last checkpoint before the kill


class RecordTraining(Callback):
    """Records where training started (weights, optimizer state) and every step it ran."""

    def __init__(self):
        self.steps: list[int] = []
        self.start_weights: dict[str, torch.Tensor] = {}
        self.start_optimizer_state: dict = {}
        self.start_schedule_step = None

    def on_train_start(self, trainer, pl_module):
        self.start_weights = {k: v.clone() for k, v in pl_module.state_dict().items()}
        self.start_optimizer_state = _clone(trainer.optimizers[0].state_dict()["state"])
        self.start_schedule_step = trainer.lr_scheduler_configs[0].scheduler.last_epoch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append(trainer.global_step)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def kill_then_resume(job) -> tuple[RecordTraining, object]:
    """Run `job` until it is killed after step KILLED_AFTER + 1, then run it again."""
    with pytest.raises(Killed):
        run_training(job, callbacks=[KillAtStep(KILLED_AFTER + 1)])
    saved = checkpoint(job)
    assert saved["global_step"] == KILLED_AFTER
    resumed = RecordTraining()
    outcome = run_training(job, callbacks=[resumed])
    assert outcome.resumed_from == f"{job.output_dir}/{CHECKPOINT_DIR}/{LAST_CHECKPOINT}"
    return resumed, outcome


def assert_same_tensors(a, b):
    """Equal nested dicts/lists of tensors and numbers, bit for bit."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_tensors(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_tensors(x, y)
    else:
        assert a == b


# One training conversation (the other is held out), every valid position an anchor.
DETERMINISTIC = ("data.batch_size=1", "data.val_fraction=0.5", "training.num_anchors=512")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The deterministic job run straight through: (job, recorder, final checkpoint)."""
    tmp_path = tmp_path_factory.mktemp("resume")
    job = training_job(tmp_path, "uninterrupted", 2, *DETERMINISTIC)
    recorder = RecordTraining()
    outcome = run_training(job, callbacks=[recorder])
    assert outcome.resumed_from is None and outcome.global_step == MAX_STEPS
    return tmp_path, recorder, checkpoint(job)


def test_a_resumed_run_equals_the_uninterrupted_run(uninterrupted):
    tmp_path, _, straight = uninterrupted
    job = training_job(tmp_path, "killed", 2, *DETERMINISTIC)
    resumed, outcome = kill_then_resume(job)
    assert outcome.global_step == MAX_STEPS
    # only the missing steps ran, from the checkpoint's step
    assert resumed.steps == list(range(KILLED_AFTER, MAX_STEPS))
    final = checkpoint(job)
    assert_same_tensors(final["state_dict"], straight["state_dict"])
    assert_same_tensors(final["optimizer_states"], straight["optimizer_states"])  # Adam moments, lr
    assert_same_tensors(final["lr_schedulers"], straight["lr_schedulers"])


def test_resume_never_starts_fresh_next_to_a_checkpoint(uninterrupted):
    tmp_path, straight_run, straight = uninterrupted
    job = training_job(tmp_path, "killed_then_fresh", 2, *DETERMINISTIC)
    with pytest.raises(Killed):
        run_training(job, callbacks=[KillAtStep(KILLED_AFTER + 1)])
    fresh = RecordTraining()
    outcome = run_training(dataclasses.replace(job, checkpoint=dataclasses.replace(job.checkpoint, resume="never")), [fresh])
    assert outcome.resumed_from is None
    assert fresh.steps == list(range(MAX_STEPS))
    # it started from the seeded initial weights, with no optimizer state, not from the checkpoint
    assert_same_tensors(fresh.start_weights, straight_run.start_weights)
    assert fresh.start_optimizer_state == {}
    assert_same_tensors(checkpoint(job)["state_dict"], straight["state_dict"])


def test_resume_with_shuffled_batches_continues_weights_optimizer_and_schedule(tmp_path):
    # 10 conversations, 2 held out, batches of 2: 4 batches an epoch, so step 3 is mid-epoch
    job = training_job(tmp_path, "shuffled", 10, "data.batch_size=2", "data.val_fraction=0.2")
    with pytest.raises(Killed):
        run_training(job, callbacks=[KillAtStep(KILLED_AFTER + 1)])
    saved = checkpoint(job)
    resumed = RecordTraining()
    outcome = run_training(job, callbacks=[resumed])
    assert outcome.resumed_from is not None and outcome.global_step == MAX_STEPS
    assert resumed.steps == list(range(KILLED_AFTER, MAX_STEPS))
    assert_same_tensors(resumed.start_weights, saved["state_dict"])
    assert_same_tensors(resumed.start_optimizer_state, saved["optimizer_states"][0]["state"])
    assert resumed.start_schedule_step == KILLED_AFTER
    # the learning rate is the uninterrupted schedule's at the last step
    final_lr = checkpoint(job)["optimizer_states"][0]["param_groups"][0]["lr"]
    assert final_lr == pytest.approx(LEARNING_RATE * warmup_cosine_schedule(MAX_STEPS, job.training.warmup_ratio)(MAX_STEPS))
