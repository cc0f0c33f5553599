"""The loss normalised over an optimizer step's global batch (docs/design.md invariant 10):
with gradient accumulation, the step's gradient is that of the whole batch's sum w l / sum w,
also when micro-batches hold very different numbers of valid anchors; without it, training
backpropagates the batch's own loss, unchanged. Two ranks: tests/e2e/test_ddp_training.py."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from dflash.methods.eagle3 import Eagle3TrainSettings
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training import TrainingSettings
from dflash.training.loss import BlockLoss
from dflash.training.normalisation import GlobalLossScale
from helpers.training import (
    UNEVEN_ANCHORS,
    concatenated,
    dflash_training_module,
    eagle3_training_module,
    max_relative_difference,
    mean_of_means_gradients,
    micro_batch,
    whole_batch_gradients,
)

FEW, MANY = (20, 22), (4, 24)  # loss-mask spans: 1 valid slot per row, 54 per row


@pytest.fixture(scope="module")
def target_spec(tmp_path_factory):
    return TargetSpec(path=str(tmp_path_factory.mktemp("target") / "tiny"), build={"arch": "qwen3", "seed": 0})


def _module(target_spec, method: str):
    training = TrainingSettings(num_anchors=UNEVEN_ANCHORS, learning_rate=1e-3)
    if method == "eagle3":
        return eagle3_training_module(target_spec, Eagle3TrainSettings(ttt_length=2, seed=0), training)
    return dflash_training_module(target_spec, DrafterSpec(num_layers=1, block_size=4, num_target_features=2), training)


class StepRecorder(Callback):
    """Keeps the drafter's gradients of the first optimizer step and every backward value."""

    def __init__(self):
        self.gradients, self.outputs = None, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.outputs.append(outputs["loss"].detach())  # Lightning's value: ours / accumulate_grad_batches
        if trainer.global_step == 1 and self.gradients is None:
            self.gradients = {n: p.grad.clone() for n, p in module.drafter.named_parameters() if p.grad is not None}


def _fit_one_step(module, batches, accumulate: int) -> StepRecorder:
    recorder = StepRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        accumulate_grad_batches=accumulate,
        log_every_n_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(module, DataLoader(batches, batch_size=None))
    recorder.logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return recorder


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_accumulated_gradient_is_the_whole_batch_gradient_with_uneven_anchors(target_spec, method):
    torch.manual_seed(0)
    module = _module(target_spec, method)
    batches = [micro_batch(FEW, seed=1), micro_batch(MANY, seed=2)]
    if method == "eagle3":  # EAGLE-3 scores every response token: a short response is few positions
        batches[0]["loss_mask"][:] = False
        batches[0]["loss_mask"][:, 18:21] = True
    expected = whole_batch_gradients(module, batches)
    per_batch = mean_of_means_gradients(module, batches)
    # The check can fail: per-micro-batch normalisation gives a clearly different gradient.
    assert max_relative_difference(per_batch, expected) > 0.2
    whole_loss = float(module.compute_loss(concatenated(batches)).loss.detach())

    recorder = _fit_one_step(module, batches, accumulate=2)
    assert max_relative_difference(recorder.gradients, expected) < 1e-5
    # The logged training loss is the same global ratio: sum w l / sum w over both micro-batches.
    assert recorder.logged["train/loss"] == pytest.approx(whole_loss, rel=1e-5)


def test_without_accumulation_the_batch_loss_is_backpropagated_unchanged(target_spec):
    torch.manual_seed(0)
    module = _module(target_spec, "dflash")
    batch = micro_batch(MANY, seed=3)
    loss = module.compute_loss(batch).loss.detach()
    expected = whole_batch_gradients(module, [batch])
    recorder = _fit_one_step(module, [batch], accumulate=1)
    assert float(recorder.outputs[0]) == pytest.approx(float(loss), rel=1e-6)
    assert max_relative_difference(recorder.gradients, expected) < 1e-6


def _linear_result(weight: torch.Tensor, inputs: torch.Tensor, slot_weights: torch.Tensor) -> BlockLoss:
    """A BlockLoss of per-slot losses (inputs @ weight)^2, M = len(inputs)."""
    losses = (inputs @ weight) ** 2
    m = len(inputs)
    return BlockLoss(
        weighted_sum=(slot_weights * losses).sum(),
        slots=torch.ones(m, dtype=torch.long),
        correct=torch.zeros(m, dtype=torch.bool),
        cross_entropy=losses.detach(),
        weights=slot_weights,
    )


def test_a_step_whose_first_micro_batch_has_no_weight_is_still_normalised_globally():
    # Lightning's part by hand: backward of value / N per micro-batch, then finish_step.
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3, requires_grad=True)
    parts = [(torch.randn(0, 3, generator=generator), torch.zeros(0))]  # no valid slot at all
    parts += [(torch.randn(m, 3, generator=generator), torch.rand(m, generator=generator)) for m in (2, 7)]
    scale, accumulate, alone = GlobalLossScale(), len(parts), lambda value: value
    for inputs, slot_weights in parts:
        value = scale.backward_value(_linear_result(weight, inputs, slot_weights), world_size=1, sum_over_ranks=alone)
        (value / accumulate).backward()
    scale.finish_step([weight.grad], accumulate, alone)

    inputs, slot_weights = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    (expected,) = torch.autograd.grad(_linear_result(weight, inputs, slot_weights).loss, weight)
    torch.testing.assert_close(weight.grad, expected)
