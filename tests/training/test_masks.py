"""The training block mask: the rule entry by entry; dense SDPA == factored == flex_attention;
with a window and a causal block too (llama.cpp's rule over positions)."""

import warnings

import pytest
import torch

from dflash.drafter import DFlashDrafter, DrafterConfig
from dflash.drafter.attention import attend
from dflash.toy.tiny import tiny_config
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, set_attention_implementation
from dflash.training.masks import dense_block_mask, factored_block_mask, flex_block_mask

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


def test_a_window_and_a_causal_block_match_hand_worked_examples():
    # llama.cpp: a key at p0 is hidden from a query at p1 when p1 - p0 >= window; slot s is at anchor + s.
    # S = 6, B = 3, window 3, causal; anchors 4 (slots at 4, 5, 6) and 1 (slots at 1, 2, 3).
    mask = dense_block_mask(torch.tensor([[4, 1]]), torch.ones(1, 6, dtype=torch.bool), 3, window=3, causal=True)
    #     context 0..5        | block 0 | block 1
    assert mask[0, 0].tolist() == [
        [F, F, T, T, F, F, T, F, F, F, F, F],  # position 4 sees 2, 3 (4 - 1 >= 3) and slot 0 only
        [F, F, F, T, F, F, T, T, F, F, F, F],  # position 5: 3; slots 0, 1
        [F, F, F, F, F, F, T, T, T, F, F, F],  # position 6: no context key is within 3; slots 0..2
        [T, F, F, F, F, F, F, F, F, T, F, F],  # anchor 1, position 1: 0
        [T, F, F, F, F, F, F, F, F, T, T, F],  # position 2: 0 (2 - 0 < 3)
        [F, F, F, F, F, F, F, F, F, T, T, T],  # position 3: 3 - 0 >= 3
    ]
    # A window narrower than the block hides the block's own early slots, not its later ones.
    mask = dense_block_mask(torch.tensor([[2]]), torch.ones(1, 3, dtype=torch.bool), 4, window=2)
    assert mask[0, 0].tolist() == [
        [F, T, F, T, T, T, T],  # position 2: context 1; every slot (later ones are not hidden)
        [F, F, F, T, T, T, T],  # position 3: 3 - 1 >= 2
        [F, F, F, F, T, T, T],  # position 4: slot 0 (position 2) is 2 behind
        [F, F, F, F, F, T, T],
    ]
    plain = dense_block_mask(torch.tensor([[2]]), torch.ones(1, 3, dtype=torch.bool), 4)
    assert torch.equal(dense_block_mask(torch.tensor([[2]]), torch.ones(1, 3, dtype=torch.bool), 4, window=6), plain)


SHAPES = [(None, False), (2, False), (None, True), (3, True)]  # (window, causal); None, False: as published


@pytest.mark.parametrize("window, causal", SHAPES)
def test_flex_block_mask_encodes_the_same_rule(window, causal):
    anchors = torch.tensor([[2, 3], [1, 4]])
    key_is_real = torch.tensor([[T, T, T, T, F], [T, T, F, T, T]])
    block_mask = flex_block_mask(anchors, key_is_real, block_size=2, window=window, causal=causal)
    dense = dense_block_mask(anchors, key_is_real, block_size=2, window=window, causal=causal)
    # Evaluate the BlockMask's mask_mod on the full grid: the rule it carries.
    b, q, k = torch.meshgrid(torch.arange(2), torch.arange(4), torch.arange(9), indexing="ij")
    evaluated = block_mask.mask_mod(b, torch.zeros_like(b), q, k)
    assert torch.equal(evaluated, dense[:, 0])
    assert block_mask.shape[-2:] == (4, 9)


@pytest.mark.parametrize("window, causal", SHAPES)
def test_factored_mask_is_the_dense_masks_context_columns_and_own_blocks(window, causal):
    anchors = torch.tensor([[2, 3, 0], [1, 4, 4]])
    key_is_real = torch.tensor([[T, T, T, T, F], [T, T, F, T, T]])
    factored = factored_block_mask(anchors, key_is_real, block_size=3, window=window, causal=causal)
    dense = dense_block_mask(anchors, key_is_real, block_size=3, window=window, causal=causal)
    assert factored.block_size == 3
    assert torch.equal(factored.sees_context, dense[..., :5])
    assert (factored.sees_block is None) == (window is None and not causal)
    own_blocks = [dense[b, 0, 3 * j : 3 * j + 3, 5 + 3 * j : 8 + 3 * j] for b in range(2) for j in range(3)]
    for own in own_blocks:
        assert torch.equal(own, torch.ones(3, 3, dtype=torch.bool) if factored.sees_block is None else factored.sees_block)


@pytest.mark.parametrize("window, causal", SHAPES)
def test_factored_attention_equals_sdpa_under_the_dense_mask_with_gradients(window, causal):
    # 4 query heads over 2 kv heads (GQA), 3 blocks of 4 over 7 context keys; one
    # anchor at 0 leaves its block with no context key at all.
    torch.manual_seed(0)
    batch, heads, kv_heads, head_dim, block_size, seq_len = 2, 4, 2, 8, 4, 7
    anchors = torch.tensor([[0, 3, 6], [2, 5, 5]])
    key_is_real = torch.ones(batch, seq_len, dtype=torch.bool)
    key_is_real[1, 4:] = False
    num_queries = anchors.shape[1] * block_size
    q = torch.randn(batch, heads, num_queries, head_dim, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq_len + num_queries, head_dim, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq_len + num_queries, head_dim, requires_grad=True)
    upstream = torch.randn(batch, heads, num_queries, head_dim)

    def run(mask):
        out = attend(q, k, v, mask, "sdpa")
        grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
        return out, grads

    dense_out, dense_grads = run(dense_block_mask(anchors, key_is_real, block_size, window, causal))
    factored_out, factored_grads = run(factored_block_mask(anchors, key_is_real, block_size, window, causal))
    torch.testing.assert_close(factored_out, dense_out, atol=1e-5, rtol=1e-5)
    for factored_grad, dense_grad in zip(factored_grads, dense_grads):
        torch.testing.assert_close(factored_grad, dense_grad, atol=1e-5, rtol=1e-5)
    # Negative control: one more visible context key changes the output.
    leaky = dense_block_mask(anchors + 1, key_is_real, block_size, window, causal)
    assert (attend(q, k, v, leaky, "sdpa") - dense_out).abs().max() > 1e-3
    if window is not None:  # and a window one wider (the seeded `>` for `>=`)
        wider = dense_block_mask(anchors, key_is_real, block_size, window + 1, causal)
        assert (attend(q, k, v, wider, "sdpa") - dense_out).abs().max() > 1e-3


def _random_drafter(block_size: int, window: int | None = None, causal: bool = False) -> DFlashDrafter:
    target_config = tiny_config("qwen3", num_layers=4)
    config = DrafterConfig.from_target(
        target_config,
        num_layers=2,
        block_size=block_size,
        mask_token_id=258,
        target_layer_ids=[0, 2],
        attention_window=window,
        block_causal=causal,
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).eval()
    with torch.no_grad():  # larger weights than the init, so a wrong mask changes the output clearly
        for parameter in drafter.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.15)
    return drafter


@pytest.mark.parametrize("window, causal", SHAPES)
def test_sdpa_dense_factored_and_flex_give_the_same_drafter_outputs(window, causal):
    block_size, seq_len, hidden = 4, 20, 64
    drafter = _random_drafter(block_size, window, causal)
    embed = torch.nn.Embedding(272, hidden)
    torch.manual_seed(1)
    input_ids = torch.randint(0, 256, (2, seq_len))
    attention_mask = torch.ones(2, seq_len, dtype=torch.bool)
    attention_mask[1, 15:] = False
    loss_mask = attention_mask.clone()
    anchors = Anchors(positions=torch.tensor([[3, 4, 11, 17], [2, 9, 12, 0]]), valid=torch.tensor([[T, T, T, T], [T, T, T, F]]))
    blocks = build_blocks(input_ids, loss_mask, anchors, block_size, mask_token_id=258)
    features = torch.randn(2, seq_len, 2 * hidden)
    context_positions = torch.arange(seq_len).expand(2, seq_len)
    with torch.no_grad():
        factored = draft_blocks(drafter, embed, features, attention_mask, anchors, blocks)
        dense_mask = dense_block_mask(anchors.positions, attention_mask, block_size, window, causal)
        dense = drafter(embed(blocks.token_ids), blocks.positions, features, context_positions, mask=dense_mask)
        set_attention_implementation(drafter, "flex_attention")
        with warnings.catch_warnings():  # eager flex on CPU (forward only) warns about torch.compile
            warnings.simplefilter("ignore", UserWarning)
            flex = draft_blocks(drafter, embed, features, attention_mask, anchors, blocks)
        # Negative control: letting blocks see their anchor's own features changes the output.
        set_attention_implementation(drafter, "sdpa")
        leaky_anchors = Anchors(positions=anchors.positions + 1, valid=anchors.valid)
        leaky = drafter(
            embed(blocks.token_ids),
            blocks.positions,
            features,
            context_positions,
            mask=dense_block_mask(leaky_anchors.positions, attention_mask, block_size, window, causal),
        )
    torch.testing.assert_close(factored, dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    assert (leaky - dense).abs().max() > 1e-2
