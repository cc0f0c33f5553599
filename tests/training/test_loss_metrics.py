"""Position-weighted loss, gamma rule, and count-weighted metric aggregation."""

import math

import pytest
import torch
import torch.nn.functional as F

from dflash.training.blocks import Blocks
from dflash.training.loss import BlockLoss, LossSettings, block_loss, default_gamma, position_weights
from dflash.training.metrics import BlockMetrics, simulated_acceptance_length

T, Fa = True, False


def test_published_gammas_and_the_rule_between_them():
    assert [default_gamma(b) for b in (16, 10, 8)] == [7.0, 5.0, 4.0]
    assert default_gamma(9) == pytest.approx(4.5)
    assert default_gamma(12) == pytest.approx(5 + 2 / 3)
    assert default_gamma(32) == pytest.approx(7 + 16 / 3)
    assert default_gamma(2) == 1.0  # floored


def test_position_weights():
    weights = position_weights(4, gamma=2.0)
    assert weights.tolist() == pytest.approx([0.0, 1.0, math.exp(-0.5), math.exp(-1.0)])
    assert position_weights(4, gamma=None).tolist() == [0.0, 1.0, 1.0, 1.0]


def _blocks(labels, label_valid, block_size):
    labels = torch.tensor(labels)
    return Blocks(
        token_ids=torch.zeros_like(labels),
        positions=torch.zeros_like(labels),
        labels=labels,
        label_valid=torch.tensor(label_valid),
        slots=torch.arange(block_size).repeat(labels.shape[1] // block_size),
    )


def test_block_loss_is_weighted_mean_over_valid_slots_only():
    torch.manual_seed(0)
    block_size, vocab, hidden_size = 3, 7, 5
    hidden = torch.randn(2, 6, hidden_size, requires_grad=True)
    lm_head = torch.nn.Linear(hidden_size, vocab, bias=False)
    rows_seen = []
    lm_head.register_forward_hook(lambda module, args, out: rows_seen.append(args[0].shape[0]))
    blocks = _blocks(
        labels=[[0, 1, 2, 3, 4, 5], [6, 0, 1, 2, 3, 4]],
        label_valid=[[Fa, T, T, Fa, T, Fa], [Fa, Fa, T, Fa, Fa, Fa]],
        block_size=block_size,
    )
    weights = position_weights(block_size, gamma=2.0)
    result = block_loss(hidden, lm_head, blocks, LossSettings(block_size=block_size, gamma=2.0, chunk_rows=None))
    assert rows_seen == [4]  # logits only for the 4 valid slots
    logits = lm_head(hidden).detach()
    expected_num, expected_den = 0.0, 0.0
    for b, q in [(0, 1), (0, 2), (0, 4), (1, 2)]:
        slot = q % block_size
        ce = F.cross_entropy(logits[b, q], blocks.labels[b, q])
        expected_num += weights[slot] * ce
        expected_den += weights[slot]
    assert result.loss.item() == pytest.approx((expected_num / expected_den).item(), rel=1e-6)
    assert result.slots.tolist() == [1, 2, 1, 2]
    result.loss.backward()
    assert hidden.grad[0, 0].abs().sum() == 0 and hidden.grad[0, 1].abs().sum() > 0


def test_block_loss_without_targets_is_zero_and_still_backpropagates():
    hidden = torch.randn(1, 3, 4, requires_grad=True)
    blocks = _blocks(labels=[[1, 2, 3]], label_valid=[[Fa, Fa, Fa]], block_size=3)
    result = block_loss(hidden, torch.nn.Linear(4, 5), blocks, LossSettings(block_size=3, gamma=1.0))
    assert result.loss.item() == 0.0
    result.loss.backward()
    assert torch.equal(hidden.grad, torch.zeros_like(hidden))


def _result(slots, correct, cross_entropy=None):
    slots = torch.tensor(slots)
    cross_entropy = torch.ones(len(slots)) if cross_entropy is None else torch.tensor(cross_entropy)
    return BlockLoss(
        weighted_sum=torch.tensor(0.0),
        slots=slots,
        correct=torch.tensor(correct),
        cross_entropy=cross_entropy,
        weights=position_weights(3, None)[slots],
    )


def test_metrics_are_count_weighted_across_batches_not_mean_of_means():
    metrics = BlockMetrics(block_size=3)
    # Batch 1: 8 slot-1 targets, all correct; loss 1 each.
    metrics.update(_result([1] * 8, [T] * 8, [1.0] * 8))
    # Batch 2: 2 slot-1 targets, none correct; 2 slot-2 targets, 1 correct; loss 4 each.
    metrics.update(_result([1, 1, 2, 2], [Fa, Fa, T, Fa], [4.0] * 4))
    out = metrics.compute()
    assert out["acc_01"].item() == pytest.approx(8 / 10)  # mean of means would be 0.5
    assert out["acc_02"].item() == pytest.approx(1 / 2)
    assert out["loss"].item() == pytest.approx((8 * 1 + 4 * 4) / 12)  # mean of means: 2.5
    assert out["tau_sim"].item() == pytest.approx(1 + 0.8 + 0.8 * 0.5)
    assert set(out) == {"loss", "acc_01", "acc_02", "tau_sim"}


def test_metrics_sum_over_ranks_before_dividing():
    """merge_state applies the same "sum" reduction that syncs ranks."""
    rank0, rank1, single = BlockMetrics(3), BlockMetrics(3), BlockMetrics(3)
    first, second = _result([1] * 9, [T] * 9), _result([1, 2], [Fa, Fa])
    rank0.update(first)
    rank1.update(second)
    single.update(first)
    single.update(second)
    rank0.merge_state(rank1)
    for name, value in single.compute().items():
        assert rank0.compute()[name].item() == pytest.approx(value.item())
    assert rank0.compute()["acc_01"].item() == pytest.approx(0.9)


def test_simulated_acceptance_length():
    assert simulated_acceptance_length(torch.tensor([1.0, 1.0, 1.0])).item() == 4.0
    assert simulated_acceptance_length(torch.tensor([0.5, 0.5])).item() == pytest.approx(1.75)
    assert simulated_acceptance_length(torch.tensor([0.0, 1.0])).item() == 1.0
