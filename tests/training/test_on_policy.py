"""Invariant 26: with the agreement mask, every label the drafter is scored on is the token
greedy decoding from the block's anchor emits at that slot, on text the target did not write."""

from __future__ import annotations

import pytest
import torch

from dflash.dflash.objective import greedy_tokens
from dflash.errors import ConfigError
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks, on_policy_blocks
from dflash.training.config import TrainingSettings
from dflash.training.forward import target_features

B = 4


def _greedy_continuation(target, ids: list[int], count: int) -> list[int]:
    """The target's own greedy decoding: `count` tokens after `ids`, one full forward each."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(count):
            out.append(int(target.model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def _text(target) -> list[int]:
    """A prompt, then the target's greedy text broken at a few places by a foreign token
    (after which the text follows the target again): it agrees with greedy decoding for
    stretches, and disagrees in places."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 200, (6,), generator=generator).tolist()
    for stretch in (5, 3, 6, 2, 7):
        ids += _greedy_continuation(target, ids, stretch)
        ids.append(int(torch.randint(3, 200, (1,), generator=generator)))
    return ids


def test_masked_labels_are_what_greedy_decoding_emits_from_the_anchor(qwen3_target):
    target = qwen3_target
    ids = _text(target)
    input_ids = torch.tensor([ids])
    loss_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    loss_mask[0, 6:] = True
    positions = torch.arange(5, len(ids) - 1)[None]  # every anchor of the response
    anchors = Anchors(positions=positions, valid=torch.ones_like(positions, dtype=torch.bool))
    blocks = build_blocks(input_ids, loss_mask, anchors, B, mask_token_id=0)
    final = target_features(target, input_ids, [target.num_layers - 1])
    greedy = greedy_tokens(target, final, blocks, chunk_rows=5)
    masked = on_policy_blocks(blocks, greedy, B)

    kept_beyond_first = wrong_without_mask = 0
    for j, anchor in enumerate(positions[0].tolist()):
        on_policy = _greedy_continuation(target, ids[: anchor + 1], B - 1)
        for k in range(1, B):
            q = j * B + k
            if not blocks.label_valid[0, q]:
                assert not masked.label_valid[0, q]
                continue
            if masked.label_valid[0, q]:
                assert int(masked.labels[0, q]) == on_policy[k - 1], (anchor, k)
                kept_beyond_first += k > 1
            wrong_without_mask += int(greedy[0, q]) != on_policy[k - 1]
        assert masked.label_valid[0, j * B + 1] == blocks.label_valid[0, j * B + 1]  # slot 1 is always on-policy
    assert kept_beyond_first > 10  # the mask keeps the agreeing stretches' later slots
    assert wrong_without_mask > 0  # and without it some argmax labels are not what decoding emits


def test_on_the_targets_own_text_the_mask_keeps_every_slot_and_label():
    labels = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    valid = torch.tensor([[False, True, True, True, False, True, True, False]])
    from dflash.training.blocks import Blocks

    blocks = Blocks(labels.clone(), labels.clone(), labels.clone(), valid, torch.arange(B).repeat(2))
    same = on_policy_blocks(blocks, labels.clone(), B)
    assert torch.equal(same.label_valid, valid) and torch.equal(same.labels, labels)
    greedy = labels.clone()
    greedy[0, 2] = 99  # slot 2 of block 0 disagrees: slot 3 loses its context; slot 2 itself is relabelled
    greedy[0, 5] = 98  # block 1, slot 1: slot 2 goes; slot 3 was invalid already
    masked = on_policy_blocks(blocks, greedy, B)
    assert masked.label_valid.tolist() == [[False, True, True, False, False, True, False, False]]
    assert masked.labels[0, 2] == 99 and masked.labels[0, 5] == 98


def test_the_agreement_mask_needs_a_loss_that_reads_the_target():
    with pytest.raises(ConfigError, match="agreement_mask: labels the target's greedy tokens"):
        TrainingSettings(agreement_mask=True)
    assert TrainingSettings(agreement_mask=True, loss="ce_target_argmax").agreement_mask


def test_the_option_reaches_the_training_step(tmp_path, monkeypatch):
    """`python -m dflash.train training.loss=ce_target_argmax training.agreement_mask=true`:
    the step scores the target's greedy tokens (from its own forward), on a subset of the slots."""
    import dflash.dflash.objective as objective_code
    from helpers.training import batch, module_for

    seen = []
    real = objective_code.block_loss
    monkeypatch.setattr(
        objective_code,
        "block_loss",
        lambda hidden, to_logits, blocks, *a: seen.append(blocks) or real(hidden, to_logits, blocks, *a),
    )
    data, overrides = batch(), ["drafter.block_size=4", "training.num_anchors=6", "training.loss=ce_target_argmax"]
    module = module_for(tmp_path, *overrides)
    module.compute_loss(data, torch.Generator().manual_seed(0))
    masked_module = module_for(tmp_path, *overrides, "training.agreement_mask=true")
    result = masked_module.compute_loss(data, torch.Generator().manual_seed(0))
    plain, masked = seen
    assert masked.label_valid.sum() < plain.label_valid.sum() and not (masked.label_valid & ~plain.label_valid).any()
    positions = torch.arange(data["input_ids"].shape[1]).expand_as(data["input_ids"])
    greedy = masked_module.target.forward(data["input_ids"], positions).logits.argmax(-1)
    valid = masked.label_valid
    batch_index = torch.arange(valid.shape[0])[:, None].expand_as(valid)[valid]
    assert torch.equal(masked.labels[valid], greedy[batch_index, masked.positions[valid] - 1])
    assert torch.isfinite(result.loss)
