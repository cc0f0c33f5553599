"""The training block mask: the rule entry by entry, and dense SDPA == flex_attention."""

import warnings

import torch

from dflash.drafter import DrafterConfig, DFlashDrafter
from dflash.target.tiny import tiny_config
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, set_attention_implementation
from dflash.training.masks import dense_block_mask, flex_block_mask

T, F = True, False


def test_dense_mask_matches_hand_worked_example():
    # S = 5 context keys, B = 2, two blocks per sequence -> 4 queries, 5 + 4 = 9 keys.
    # Sequence 0: anchors 2 and 3, last token is padding.
    # Sequence 1: anchors 1 and 4, position 2 is not a real token.
    anchors = torch.tensor([[2, 3], [1, 4]])
    key_is_real = torch.tensor([[T, T, T, T, F], [T, T, F, T, T]])
    mask = dense_block_mask(anchors, key_is_real, block_size=2)
    assert mask.shape == (2, 1, 4, 9) and mask.dtype == torch.bool
    #            context 0..4     | block 0 | block 1
    expected_0 = [
        [T, T, F, F, F, T, T, F, F],  # block 0 (anchor 2), slot 0: positions < 2
        [T, T, F, F, F, T, T, F, F],  # block 0, slot 1: same context, whole own block
        [T, T, T, F, F, F, F, T, T],  # block 1 (anchor 3): positions < 3, never the anchor itself
        [T, T, T, F, F, F, F, T, T],
    ]
    expected_1 = [
        [T, F, F, F, F, T, T, F, F],  # anchor 1: only position 0
        [T, F, F, F, F, T, T, F, F],
        [T, T, F, T, F, F, F, T, T],  # anchor 4: 0, 1, 3 (2 is not real, 4 is the anchor)
        [T, T, F, T, F, F, F, T, T],
    ]
    assert mask[0, 0].tolist() == expected_0
    assert mask[1, 0].tolist() == expected_1


def test_anchor_at_zero_sees_only_its_block():
    mask = dense_block_mask(torch.tensor([[0]]), torch.ones(1, 3, dtype=torch.bool), block_size=3)
    assert mask[0, 0].tolist() == [[F, F, F, T, T, T]] * 3


def test_flex_block_mask_encodes_the_same_rule():
    anchors = torch.tensor([[2, 3], [1, 4]])
    key_is_real = torch.tensor([[T, T, T, T, F], [T, T, F, T, T]])
    block_mask = flex_block_mask(anchors, key_is_real, block_size=2)
    dense = dense_block_mask(anchors, key_is_real, block_size=2)
    # Evaluate the BlockMask's mask_mod on the full grid: the rule it carries.
    b, q, k = torch.meshgrid(torch.arange(2), torch.arange(4), torch.arange(9), indexing="ij")
    evaluated = block_mask.mask_mod(b, torch.zeros_like(b), q, k)
    assert torch.equal(evaluated, dense[:, 0])
    assert block_mask.shape[-2:] == (4, 9)


def _random_drafter(block_size: int) -> DFlashDrafter:
    target_config = tiny_config("qwen3", num_layers=4)
    config = DrafterConfig.from_target(
        target_config, num_layers=2, block_size=block_size, mask_token_id=258, target_layer_ids=[0, 2]
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).eval()
    with torch.no_grad():  # larger weights than the init, so a wrong mask changes the output clearly
        for parameter in drafter.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.15)
    return drafter


def test_sdpa_and_flex_give_the_same_drafter_outputs():
    block_size, seq_len, hidden = 4, 20, 64
    drafter = _random_drafter(block_size)
    embed = torch.nn.Embedding(272, hidden)
    torch.manual_seed(1)
    input_ids = torch.randint(0, 256, (2, seq_len))
    attention_mask = torch.ones(2, seq_len, dtype=torch.bool)
    attention_mask[1, 15:] = False
    loss_mask = attention_mask.clone()
    anchors = Anchors(positions=torch.tensor([[3, 4, 11, 17], [2, 9, 12, 0]]), valid=torch.tensor([[T, T, T, T], [T, T, T, F]]))
    blocks = build_blocks(input_ids, loss_mask, anchors, block_size, mask_token_id=258)
    features = torch.randn(2, seq_len, 2 * hidden)
    with torch.no_grad():
        dense = draft_blocks(drafter, embed, features, attention_mask, anchors, blocks)
        set_attention_implementation(drafter, "flex_attention")
        with warnings.catch_warnings():  # eager flex on CPU (forward only) warns about torch.compile
            warnings.simplefilter("ignore", UserWarning)
            flex = draft_blocks(drafter, embed, features, attention_mask, anchors, blocks)
        # Negative control: letting blocks see their anchor's own features changes the output.
        set_attention_implementation(drafter, "sdpa")
        leaky_anchors = Anchors(positions=anchors.positions + 1, valid=anchors.valid)
        context_positions = torch.arange(seq_len).expand(2, seq_len)
        leaky = drafter(
            embed(blocks.token_ids),
            blocks.positions,
            features,
            context_positions,
            mask=dense_block_mask(leaky_anchors.positions, attention_mask, block_size),
        )
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    assert (leaky - dense).abs().max() > 1e-2
