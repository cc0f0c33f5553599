"""Anchor sampling and block layout (docs/design.md invariants 3, 4 and 9)."""

import torch

from dflash.training.anchors import Anchors, sample_anchors, valid_anchor_mask
from dflash.training.blocks import build_blocks
from helpers.stats import chi2_sf

T, F = True, False


def test_valid_anchors_need_a_target_ahead_within_the_block():
    loss_mask = torch.tensor([[F, F, T, T, F, F, F, T, F, F]])
    # B=3: a needs loss_mask[a] and a target in a+1..a+2.
    assert valid_anchor_mask(loss_mask, 3).tolist() == [[F, F, T, F, F, F, F, F, F, F]]
    # B=5: position 3 qualifies too, its block 4..7 reaches the target at 7.
    assert valid_anchor_mask(loss_mask, 5).tolist() == [[F, F, T, T, F, F, F, F, F, F]]
    # The last position never opens a block (nothing follows it).
    assert valid_anchor_mask(torch.ones(1, 4, dtype=torch.bool), 4).tolist() == [[T, T, T, F]]


# Response segments with gaps and a lone token: valid anchors are not one unbroken run.
SEGMENTED_MASK = torch.zeros(40, dtype=torch.bool)
for start, stop in ((4, 12), (14, 16), (19, 20), (25, 36)):
    SEGMENTED_MASK[start:stop] = True
UNIFORMITY_ROWS, UNIFORMITY_ANCHORS, FALSE_ALARM = 20000, 5, 1e-3


def uniformity_p_value(sampler, loss_mask: torch.Tensor, block_size: int) -> float:
    """p-value of "every valid position is chosen equally often", from one batch of
    UNIFORMITY_ROWS copies of `loss_mask` (1, S), UNIFORMITY_ANCHORS anchors each.

    Choosing k of V positions without replacement: each count has mean n k/V and the
    count vector's covariance is n p (1-p) V/(V-1) (I - 1 1'/V), p = k/V; so Pearson's
    statistic divided by (1-p) V/(V-1) is chi-square with V-1 degrees of freedom.
    """
    valid = valid_anchor_mask(loss_mask, block_size)[0]
    generator = torch.Generator().manual_seed(0)
    anchors = sampler(loss_mask.expand(UNIFORMITY_ROWS, -1), block_size, UNIFORMITY_ANCHORS, generator=generator)
    assert anchors.valid.all()
    counts = torch.bincount(anchors.positions.flatten(), minlength=loss_mask.shape[1]).double()
    assert counts[~valid].sum() == 0
    num_valid, p = int(valid.sum()), UNIFORMITY_ANCHORS / int(valid.sum())
    expected = UNIFORMITY_ROWS * p
    pearson = float(((counts[valid] - expected) ** 2 / expected).sum())
    return chi2_sf(pearson / ((1 - p) * num_valid / (num_valid - 1)), num_valid - 1)


def early_biased_anchors(loss_mask, block_size, num_anchors, generator):
    """Negative control: draws without replacement, the first half of the valid positions
    of each row 15% likelier than the second half."""
    valid = valid_anchor_mask(loss_mask, block_size)
    rank = valid.long().cumsum(dim=1)
    early = rank <= valid.sum(dim=1, keepdim=True) / 2
    weights = valid * torch.where(early, 1.15, 1.0)
    chosen = torch.multinomial(weights, num_anchors, replacement=False, generator=generator)
    return Anchors(positions=chosen.sort(dim=1).values, valid=torch.ones_like(chosen, dtype=torch.bool))


def test_random_anchors_are_distinct_sorted_valid_and_uniform():
    loss_mask = SEGMENTED_MASK.unsqueeze(0)
    anchors = sample_anchors(loss_mask.expand(200, -1), 4, num_anchors=5, generator=torch.Generator().manual_seed(0))
    assert anchors.valid.all() and anchors.positions.shape == (200, 5)
    assert (anchors.positions.diff(dim=1) > 0).all()  # distinct and sorted
    assert valid_anchor_mask(loss_mask, 4)[0, anchors.positions].all()
    assert uniformity_p_value(sample_anchors, loss_mask, 4) > FALSE_ALARM


def test_uniformity_check_catches_a_sampler_biased_toward_early_positions():
    assert uniformity_p_value(early_biased_anchors, SEGMENTED_MASK.unsqueeze(0), 4) < FALSE_ALARM


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


def test_stride_counts_valid_positions_across_broken_response_segments():
    # B=4 on SEGMENTED_MASK: valid anchors are 4..11 (11 reaches the target at 14), 14
    # (not 15: nothing in 16..18), not the lone 19, and 25..34: 19 positions. Counting
    # them across the gaps, every 4th (ranks 0, 4, 8, 12, 16) is 4, 8, 14, 28, 32.
    anchors = sample_anchors(SEGMENTED_MASK.unsqueeze(0), 4, num_anchors=100, mode="stride")
    assert anchors.positions[0].tolist() == [4, 8, 14, 28, 32]


def valid_positions(loss_mask: list[bool], block_size: int) -> list[int]:
    """Rule 5 written out: loss_mask[a] and a training target in a+1 .. a+B-1."""
    return [a for a in range(len(loss_mask)) if loss_mask[a] and any(loss_mask[a + 1 : a + block_size])]


def test_stride_matches_the_rule_on_many_short_segments_per_row():
    generator = torch.Generator().manual_seed(1)
    # rows of short random segments (a token is a target with probability 0.4), padded per row
    loss_mask = torch.rand(64, 50, generator=generator) < 0.4
    for block_size, num_anchors in ((2, 100), (4, 100), (5, 3)):
        anchors = sample_anchors(loss_mask, block_size, num_anchors=num_anchors, mode="stride")
        for row, positions, valid in zip(loss_mask.tolist(), anchors.positions, anchors.valid):
            assert positions[valid].tolist() == valid_positions(row, block_size)[::block_size][:num_anchors]


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
