"""Our decode-attention kernel (dflash.engine.kernels.attention_plan, run_attention) computes what SDPA computes,
and the engine runs SDPA wherever the kernel does not apply."""

import pytest
import torch
import torch.nn.functional as F

from dflash.engine import kernels, native


@pytest.fixture(autouse=True)
def inference():
    with torch.inference_mode():
        yield


def case(dtype, batch, length, heads, kv_heads, head_dim=64, q=1, mask="pad", seed=0):
    """Query, cache views (the first `length` of a larger capacity) and a mask."""
    generator = torch.Generator().manual_seed(seed)
    capacity = length + 13
    cache = torch.randn(2, batch, kv_heads, capacity, head_dim, generator=generator).to(dtype)
    keys, values = cache[0, :, :, :length], cache[1, :, :, :length]
    query = torch.randn(batch, q, heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    if mask == "none":
        return query, keys, values, None
    valid = torch.ones(batch, length + 5, dtype=torch.bool)  # a strided view, as greedy_batch's
    for row in range(batch):
        valid[row, : (row * 7) % length] = False  # left padding of each row
    valid[0, : length - 1] = False  # only its own (last) key
    keep = valid[:, None, None, :length]
    if q > 1:  # causal over the new positions, besides the padding
        keys_at = torch.arange(length)
        keep = keep & (keys_at <= torch.arange(length - q, length).unsqueeze(1))
    return query, keys, values, keep


def attention(query, keys, values, mask):
    """What the engine runs for one layer: the plan's check, then our kernel (None: SDPA's turn)."""
    plan = kernels.attention_plan(query, keys, values, mask)
    return None if plan is None else kernels.run_attention(query, keys, values, plan[0])


def check(dtype, *args, **kwargs):
    query, keys, values, mask = case(dtype, *args, **kwargs)
    ours = attention(query, keys, values, mask)
    assert ours is not None and ours.dtype == dtype and ours.shape == query.shape
    gqa = query.shape[1] != keys.shape[1]
    sdpa = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=gqa)
    exact = F.scaled_dot_product_attention(query.double(), keys.double(), values.double(), attn_mask=mask, enable_gqa=gqa)
    scale = exact.abs().max()
    if dtype == torch.float32:
        assert (ours.double() - exact).abs().max() <= 2e-6 * scale
        assert (ours.double() - sdpa.double()).abs().max() <= 1e-5 * scale
    else:  # the inputs' rounding, then one rounding of the output
        assert (ours.double() - exact).abs().max() <= 2e-2 * scale
        assert (ours.double() - sdpa.double()).abs().max() <= 2e-2 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 17, 300])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4)])
@pytest.mark.parametrize("mask", ["pad", "none"])
def test_decode_attention_equals_sdpa(kernel_isa, dtype, batch, length, heads, mask):
    check(dtype, batch, length, *heads, mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("head_dim", "q"), [(128, 1), (256, 3), (64, 16), (128, 16), (64, 40), (128, 33)])
def test_other_head_dims_and_several_queries_equal_sdpa(kernel_isa, dtype, head_dim, q):
    check(dtype, 2, 40, 12, 3, head_dim=head_dim, q=q)
    check(dtype, 2, 40, 12, 3, head_dim=head_dim, q=q, mask="none")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keys_before_every_rows_first_seen_key_are_skipped_rightly(kernel_isa, dtype):
    """The kernel starts each (batch row, kv head) at the first key any of its query rows sees:
    rows that start at other keys (not the first row's, not in order) still see all of theirs."""
    query, keys, values, _ = case(dtype, 2, 160, 9, 3, q=3, mask="none")
    first = torch.tensor([[130, 81, 100], [93, 150, 77]])  # (batch, query row): its first seen key
    mask = (torch.arange(160) >= first.unsqueeze(-1)).unsqueeze(1)
    ours = attention(query, keys, values, mask)
    exact = F.scaled_dot_product_attention(query.double(), keys.double(), values.double(), attn_mask=mask, enable_gqa=True)
    assert (ours.double() - exact).abs().max() <= (2e-6 if dtype == torch.float32 else 2e-2) * exact.abs().max()
    # the same keys without the leading 64 that no row sees (a whole chunk of keys on every
    # instruction set): the same result, bit for bit
    torch.testing.assert_close(attention(query, keys[:, :, 64:], values[:, :, 64:], mask[..., 64:]), ours, rtol=0, atol=0)
    # each row alone (its own first key, so its own start): the same bits as among the others
    for i in range(3):
        alone = attention(query[:, :, i : i + 1], keys, values, mask[:, :, i : i + 1])
        torch.testing.assert_close(alone, ours[:, :, i : i + 1], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [17, 300])
def test_a_mask_strided_along_the_keys_gives_the_same_bits(kernel_isa, dtype, length):
    """The kernel reads a mask's keys 8 at a time where they are contiguous, one at a time
    otherwise: the same mask stored keys-first (stride q along the keys) gives the same bits."""
    query, keys, values, mask = case(dtype, 3, length, 9, 3, q=5)
    mask = mask.expand(3, 1, 5, length)
    strided = mask.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)
    assert mask.stride(-1) == 1 and strided.stride(-1) == 5
    torch.testing.assert_close(attention(query, keys, values, strided), attention(query, keys, values, mask), rtol=0, atol=0)
    check(dtype, 3, length, 9, 3, q=5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "q"), [(1, 1), (1, 8), (1, 5), (3, 3)])
def test_rows_split_over_threads_give_the_same_bits(kernel_isa, dtype, batch, q):
    """3 kv heads on 2 or 4 threads: each (batch row, kv head)'s query rows are cut in parts
    (batch 3: 9 pairs on 2 threads); the result is the one-thread result, bit for bit."""
    query, keys, values, mask = case(dtype, batch, 300, 9, 3, q=q)
    threads = torch.get_num_threads()
    try:
        alone = attention(query, keys, values, mask)
        for count in (2, 4):
            torch.set_num_threads(count)
            torch.testing.assert_close(attention(query, keys, values, mask), alone, rtol=0, atol=0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_among_many_gives_the_bits_it_gives_alone(kernel_isa, dtype):
    """Each query row of a causal forward over 40 new positions (a prefill, a verification)
    equals, bit for bit, the same position run alone over only the keys it sees (decoding):
    a row's result depends on its own query, keys and mask, not on the rows grouped with it,
    nor on the chunks of keys past its last seen one that the group's pass skips."""
    query, keys, values, mask = case(dtype, 2, 70, 9, 3, q=40)
    together = attention(query, keys, values, mask)
    for i in (0, 7, 21, 39):
        end = 70 - 40 + i + 1
        alone = attention(query[:, :, i : i + 1], keys[:, :, :end], values[:, :, :end], mask[:, :, i : i + 1, :end])
        torch.testing.assert_close(together[:, :, i : i + 1], alone, rtol=0, atol=0)


def test_a_row_with_every_key_masked_is_zero_as_sdpa(kernel_isa):
    query, keys, values, mask = case(torch.float32, 2, 17, 9, 3)
    mask = mask.clone()
    mask[1] = False
    ours = attention(query, keys, values, mask)
    sdpa = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(ours, sdpa)
    assert not ours[1].any()


def test_where_the_kernel_does_not_apply_the_caller_runs_sdpa():
    query, keys, values, mask = case(torch.float32, 2, 17, 9, 3)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    assert attention(query, keys, values, additive) is None
    assert attention(query.half(), keys.half(), values.half(), None) is None
    odd = case(torch.float32, 2, 17, 9, 3, head_dim=48)
    assert attention(*odd) is None
    with torch.inference_mode(False), torch.enable_grad():
        assert attention(query.clone(), keys.clone(), values.clone(), mask) is None


def test_no_kernel_on_the_machine_means_sdpa(monkeypatch):
    monkeypatch.setattr(native, "module", lambda: None)
    query, keys, values, mask = case(torch.float32, 2, 17, 9, 3)
    assert attention(query, keys, values, mask) is None
    assert not kernels.attention_available(query)
