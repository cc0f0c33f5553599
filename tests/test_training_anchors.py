"""Anchor sampling and block layout (DESIGN.md rules 1, 4, 5)."""

import torch

from dflash.training.anchors import Anchors, sample_anchors, valid_anchor_mask
from dflash.training.blocks import build_blocks

T, F = True, False


def test_valid_anchors_need_a_target_ahead_within_the_block():
    loss_mask = torch.tensor([[F, F, T, T, F, F, F, T, F, F]])
    # B=3: a needs loss_mask[a] and a target in a+1..a+2.
    assert valid_anchor_mask(loss_mask, 3).tolist() == [[F, F, T, F, F, F, F, F, F, F]]
    # B=5: position 3 qualifies too, its block 4..7 reaches the target at 7.
    assert valid_anchor_mask(loss_mask, 5).tolist() == [[F, F, T, T, F, F, F, F, F, F]]
    # The last position never opens a block (nothing follows it).
    assert valid_anchor_mask(torch.ones(1, 4, dtype=torch.bool), 4).tolist() == [[T, T, T, F]]


def test_random_anchors_are_distinct_sorted_valid_and_uniform():
    loss_mask = torch.zeros(1, 40, dtype=torch.bool)
    loss_mask[0, 10:30] = True
    valid = valid_anchor_mask(loss_mask, 4)
    counts = torch.zeros(40)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2000):
        anchors = sample_anchors(loss_mask, 4, num_anchors=5, generator=generator)
        positions = anchors.positions[0]
        assert anchors.valid.all() and positions.shape == (5,)
        assert torch.equal(positions, positions.unique())  # distinct and sorted
        assert valid[0, positions].all()
        counts[positions] += 1
    chosen = counts[valid[0]]
    assert counts[~valid[0]].sum() == 0
    expected = 2000 * 5 / int(valid.sum())
    assert (chosen - expected).abs().max() < 0.2 * expected


def test_few_valid_positions_take_all_and_pad_per_sequence():
    loss_mask = torch.zeros(3, 12, dtype=torch.bool)
    loss_mask[0, 2:12] = True  # 9 valid anchors (2..10), capped at 6
    loss_mask[1, 5:8] = True  # 2 valid anchors (5, 6)
    # row 2: no targets at all -> no anchors, no crash
    anchors = sample_anchors(loss_mask, 4, num_anchors=6)
    assert anchors.positions.shape == (3, 6)
    assert anchors.valid.sum(dim=1).tolist() == [6, 2, 0]
    assert anchors.positions[1].tolist() == [5, 6, 0, 0, 0, 0]
    assert anchors.positions[2].tolist() == [0] * 6


def test_batch_without_any_anchor_keeps_one_padding_block():
    anchors = sample_anchors(torch.zeros(2, 5, dtype=torch.bool), 4, num_anchors=8)
    assert anchors.positions.shape == (2, 1) and not anchors.valid.any()


def test_stride_anchors_take_every_bth_valid_position():
    loss_mask = torch.zeros(1, 30, dtype=torch.bool)
    loss_mask[0, 3:25] = True  # valid anchors 3..23
    anchors = sample_anchors(loss_mask, 4, num_anchors=100, mode="stride")
    assert anchors.positions[0].tolist() == [3, 7, 11, 15, 19, 23]
    capped = sample_anchors(loss_mask, 4, num_anchors=2, mode="stride")
    assert capped.positions[0].tolist() == [3, 7]


def test_blocks_hold_anchor_then_masks_with_same_position_labels():
    input_ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    loss_mask = torch.tensor([[F, F, T, T, T, F, T]])
    anchors = Anchors(positions=torch.tensor([[2, 5, 0]]), valid=torch.tensor([[T, T, F]]))
    blocks = build_blocks(input_ids, loss_mask, anchors, block_size=3, mask_token_id=99)
    assert blocks.token_ids.tolist() == [[12, 99, 99, 15, 99, 99, 10, 99, 99]]
    assert blocks.positions.tolist() == [[2, 3, 4, 5, 6, 7, 0, 1, 2]]
    # Slot k of the block at anchor a is labelled with the token AT a + k.
    assert blocks.labels[0, :5].tolist() == [12, 13, 14, 15, 16]
    # Slot 0 never; position 7 is outside the sequence; padding blocks never.
    assert blocks.label_valid.tolist() == [[F, T, T, F, T, F, F, F, F]]
    assert blocks.slots.tolist() == [0, 1, 2] * 3
