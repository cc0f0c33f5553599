"""The chunked loss equals the dense one; the distillation losses and D-PACE weights equal
their definitions; the options reach the training module; bad options are one line."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dflash.errors import ConfigError
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from dflash.training.blocks import Blocks
from dflash.training.config import OBJECTIVES, TrainingSettings
from dflash.training.forward import target_features
from dflash.training.loss import LossSettings, block_loss, dpace_weights
from helpers.training import BATCH, BLOCKS, B, D, S, batch, module_for, random_blocks, softcapped_head


def run(settings: LossSettings, to_logits, blocks: Blocks, seed=1):
    """(result, grad of the loss w.r.t. the drafter hidden states)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(BATCH, BLOCKS * B, D, generator=generator).requires_grad_()
    target_hidden = torch.randn(BATCH, S, D, generator=generator)
    result = block_loss(hidden, to_logits, blocks, settings, target_hidden)
    result.loss.backward()
    return result, hidden.grad


@pytest.mark.parametrize("weights", ["gamma", "dpace"])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_chunked_loss_and_gradients_equal_the_dense_path(objective, weights):
    head, to_logits = softcapped_head()
    blocks = random_blocks()
    rows = int(blocks.label_valid.sum())
    settings = LossSettings(block_size=B, objective=objective, position_weights=weights, gamma=2.0, chunk_rows=None)
    dense, dense_grad = run(settings, to_logits, blocks)
    assert dense_grad.abs().sum() > 0
    # chunk sizes that do not divide the row count, and one larger than all rows
    for chunk_rows in (1, 3, 7, rows + 5):
        assert rows % 7 and rows % 3
        chunked, grad = run(LossSettings(**{**settings.__dict__, "chunk_rows": chunk_rows}), to_logits, blocks)
        assert chunked.loss.item() == pytest.approx(dense.loss.item(), abs=1e-5)
        torch.testing.assert_close(grad, dense_grad, atol=1e-5, rtol=0)
        torch.testing.assert_close(chunked.weights, dense.weights, atol=1e-6, rtol=0)
        assert torch.equal(chunked.correct, dense.correct)
        torch.testing.assert_close(chunked.cross_entropy, dense.cross_entropy)


def test_the_top_k_logits_are_the_heads_over_the_valid_rows_at_any_chunking():
    """`block_loss(top_k=)` hands over each valid row's largest head logits and their ids
    (DFlash2's candidates), in the valid rows' order, chunked or not."""
    _, to_logits = softcapped_head()
    blocks = random_blocks()
    hidden = torch.randn(BATCH, BLOCKS * B, D, generator=torch.Generator().manual_seed(1))
    expected = to_logits(hidden[blocks.label_valid]).float().topk(3, dim=-1)
    for chunk_rows in (None, 1, 7):
        result = block_loss(hidden, to_logits, blocks, LossSettings(block_size=B, chunk_rows=chunk_rows), top_k=3)
        torch.testing.assert_close(result.top_logits, expected.values, rtol=0, atol=1e-6)
        assert torch.equal(result.top_ids, expected.indices)
    assert block_loss(hidden, to_logits, blocks, LossSettings(block_size=B)).top_ids is None
    no_slot = dataclasses.replace(blocks, label_valid=torch.zeros_like(blocks.label_valid))
    empty = block_loss(hidden.requires_grad_(), to_logits, no_slot, LossSettings(block_size=B, chunk_rows=7), top_k=3)
    assert empty.top_ids.shape == (0, 3) and empty.weighted_sum.requires_grad and empty.loss.item() == 0


def test_chunked_loss_never_holds_more_rows_and_leaves_the_head_without_gradient():
    head, to_logits = softcapped_head(requires_grad=True)  # even a head that could train gets none
    rows_per_call = []
    head.register_forward_hook(lambda module, args, out: rows_per_call.append(args[0].shape[0]))
    blocks = random_blocks()
    run(LossSettings(block_size=B, objective="kl", chunk_rows=4), to_logits, blocks)
    assert max(rows_per_call) == 4 and sum(rows_per_call) == 2 * int(blocks.label_valid.sum())  # drafter + target
    assert head.weight.grad is None


def test_kl_and_target_argmax_equal_a_direct_computation():
    """The target's logits for the token at anchor+k come from position anchor+k-1."""
    head, to_logits = softcapped_head()
    blocks = random_blocks()
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(BATCH, BLOCKS * B, D, generator=generator)
    target_hidden = torch.randn(BATCH, S, D, generator=generator)
    kl, argmax_ce, weights = [], [], []
    for b in range(BATCH):
        for q in range(BLOCKS * B):
            if not blocks.label_valid[b, q]:
                continue
            drafter_log_probs = to_logits(hidden[b, q]).log_softmax(-1)
            target_logits = to_logits(target_hidden[b, blocks.positions[b, q] - 1])
            target_probs = target_logits.softmax(-1)
            kl.append(float((target_probs * (target_probs.log() - drafter_log_probs)).sum()))
            argmax_ce.append(float(-drafter_log_probs[target_logits.argmax()]))
            weights.append(math.exp(-(int(blocks.slots[q]) - 1) / 2.0))
    for objective, per_slot in (("kl", kl), ("ce_target_argmax", argmax_ce)):
        settings = LossSettings(block_size=B, objective=objective, gamma=2.0, chunk_rows=3)
        result = block_loss(hidden, to_logits, blocks, settings, target_hidden)
        expected = sum(w * value for w, value in zip(weights, per_slot)) / sum(weights)
        assert result.loss.item() == pytest.approx(expected, rel=1e-5)


def test_metrics_read_the_data_tokens_under_every_objective():
    """acc_k and tau_sim come from `correct`, the logged loss from `cross_entropy`: both
    against the data tokens, whatever the training objective."""
    head, to_logits = softcapped_head()
    blocks = random_blocks()
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(BATCH, BLOCKS * B, D, generator=generator)
    target_hidden = torch.randn(BATCH, S, D, generator=generator)
    log_probs = to_logits(hidden).log_softmax(-1)
    blocks.labels[:, ::2] = log_probs.argmax(-1)[:, ::2]  # half the slots predicted right
    valid = blocks.label_valid
    expected_correct = (log_probs.argmax(-1) == blocks.labels)[valid]
    expected_ce = -log_probs.gather(-1, blocks.labels[..., None]).squeeze(-1)[valid]
    assert expected_correct.any() and not expected_correct.all()
    for objective in OBJECTIVES:
        result = block_loss(hidden, to_logits, blocks, LossSettings(block_size=B, objective=objective), target_hidden)
        assert torch.equal(result.correct, expected_correct)
        torch.testing.assert_close(result.cross_entropy, expected_ce)


def test_dpace_weights_follow_the_papers_formula_on_a_hand_example():
    # one block of B = 4: slot 0 (anchor) never valid; q = drafter's probability of the label
    alpha = 0.5
    q = [0.8, 0.5, 0.9]
    losses = -torch.log(torch.tensor(q))
    s1, s2, s3 = [(1 - alpha) * value + alpha for value in q]  # 0.9, 0.75, 0.95
    weights = dpace_weights(losses, torch.tensor([1, 2, 3]), num_blocks=1, block_size=4, alpha=alpha)
    expected = [s1 + s1 * s2 + s1 * s2 * s3, s1 * s2 + s1 * s2 * s3, s1 * s2 * s3]  # 2.21625, 1.31625, 0.64125
    assert weights.tolist() == pytest.approx(expected)
    # an invalid slot 2 is a no-op in the products and left out of the sums; blocks are independent
    weights = dpace_weights(losses[[0, 2, 0]], torch.tensor([1, 3, 5]), num_blocks=2, block_size=4, alpha=alpha)
    assert weights.tolist() == pytest.approx([s1 + s1 * s3, s1 * s3, s1])


def test_target_final_hidden_gives_the_targets_own_logits():
    for arch in ("qwen3", "gemma2"):  # gemma2: final softcapping in the head transform
        model, _ = build_tiny_target(arch)
        target = TargetModel(model)
        input_ids = torch.randint(0, 250, (2, 12), generator=torch.Generator().manual_seed(0))
        # the training module's layout: the taps, then layer L-1 as the final hidden states
        states = target_features(target, input_ids, [0, 2, target.num_layers - 1])
        features, final_hidden = states[..., : 2 * target.hidden_size], states[..., 2 * target.hidden_size :]
        positions = torch.arange(12).expand(2, 12)
        full = target.forward(input_ids, positions, layer_ids=[0, 2])
        torch.testing.assert_close(target.logits(final_hidden), full.logits, atol=1e-5, rtol=1e-5)
        assert torch.equal(features, full.features)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return tmp_path_factory.mktemp("loss_artifacts")


def recorded(module, data, monkeypatch):
    """compute_loss's result, and the blocks and drafter hidden states it scored."""
    import dflash.dflash.objective as module_code

    seen = {}
    real_block_loss = module_code.block_loss

    def recording_block_loss(hidden, to_logits, blocks, *args):
        seen.update(hidden=hidden.detach(), blocks=blocks)
        return real_block_loss(hidden, to_logits, blocks, *args)

    monkeypatch.setattr(module_code, "block_loss", recording_block_loss)
    result = module.compute_loss(data, torch.Generator().manual_seed(0))
    monkeypatch.undo()
    return result, seen["blocks"], seen["hidden"]


def test_loss_options_reach_the_module_and_leave_the_metrics_alone(artifacts, monkeypatch):
    data, overrides = batch(), ["drafter.block_size=8", "training.num_anchors=6"]
    ce, blocks, _ = recorded(module_for(artifacts, *overrides, "training.loss_chunk_rows=5"), data, monkeypatch)
    valid = blocks.label_valid
    weights = torch.tensor([math.exp(-(k - 1) / 4.0) for k in ce.slots.tolist()])  # gamma = 4 for B = 8

    # kl: forward KL from the target's own distribution at position anchor+k-1 of a full forward
    module = module_for(artifacts, *overrides, "training.loss=kl")
    kl, kl_blocks, hidden = recorded(module, data, monkeypatch)
    assert torch.equal(kl_blocks.positions, blocks.positions)  # same anchors
    positions = torch.arange(data["input_ids"].shape[1]).expand_as(data["input_ids"])
    target_log_probs = module.target.forward(data["input_ids"], positions).logits.log_softmax(-1)
    batch_index = torch.arange(valid.shape[0])[:, None].expand_as(valid)[valid]
    target_rows = target_log_probs[batch_index, blocks.positions[valid] - 1]
    drafter_rows = module.target.logits(hidden[valid]).log_softmax(-1)
    per_slot = (target_rows.exp() * (target_rows - drafter_rows)).sum(-1)
    assert kl.loss.item() == pytest.approx(float((weights * per_slot).sum() / weights.sum()), rel=1e-5)
    # the metrics read the data tokens whatever the loss
    assert torch.equal(kl.correct, ce.correct)
    torch.testing.assert_close(kl.cross_entropy, ce.cross_entropy, atol=1e-5, rtol=0)

    # dpace: the paper's weights, from the drafter's probability of each data token
    dpace, _, _ = recorded(module_for(artifacts, *overrides, "training.position_weights=dpace"), data, monkeypatch)
    flat_index = valid.view(-1).nonzero().squeeze(1)
    expected = dpace_weights(dpace.cross_entropy, flat_index, valid.numel() // 8, 8, alpha=0.5)
    assert dpace.weights.tolist() == pytest.approx(expected.tolist())
    assert torch.equal(dpace.correct, ce.correct)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("loss", "mse", "loss: unknown 'mse'; choose one of ['ce', 'kl', 'ce_target_argmax']"),
        ("position_weights", "exp", "position_weights: unknown 'exp'"),
        ("loss_gamma", None, "loss_gamma: null no longer means uniform weights; set training.position_weights=uniform"),
        ("dpace_alpha", 1.5, "dpace_alpha: must be in [0, 1]"),
        ("loss_chunk_rows", 0, "loss_chunk_rows: must be >= 1"),
    ],
)
def test_a_bad_loss_option_is_one_clear_line(key, value, message):
    with pytest.raises(ConfigError) as error:
        TrainingSettings(**{key: value})
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
