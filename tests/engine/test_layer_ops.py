"""Our fused layer ops (dflash/engine/csrc/layer_ops.cpp) compute what the engine's PyTorch ops
compute, within the last bit, and the engine gives the same logits with them as without."""

import pytest
import torch
import torch.nn.functional as F

from dflash.engine import kernels, native
from dflash.engine.forward import add_rms_norm, rms_norm, rope
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def inference():
    with torch.inference_mode():
        yield


@pytest.fixture
def ops(kernel_isa):
    return native.module()


def close(ours: torch.Tensor, reference: torch.Tensor):
    """Equal within the last bit of the dtype (float32: a few ulps), of each value or, where a
    sum cancels (the rotation), of the tensor's largest."""
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    ulp = 2.0**-7 if ours.dtype == torch.bfloat16 else 2.0**-21
    error, size = (ours.double() - reference.double()).abs(), reference.double().abs()
    assert bool((error <= ulp * (size + size.max())).all()), float(error.max())


def randn(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_and_without_the_residual_add(ops, dtype):
    hidden, delta = randn(3, 5, 576, dtype=dtype), randn(3, 5, 576, dtype=dtype, seed=1)
    weight = randn(576, dtype=dtype, seed=2)
    normed, same = ops.rms_norm(hidden, weight, 1e-5, None)
    assert same is hidden
    close(normed, rms_norm(hidden, (weight, 1e-5)))
    normed, summed = ops.rms_norm(hidden, weight, 1e-5, delta)
    assert torch.equal(summed, hidden + delta)  # one rounding, as PyTorch's add
    close(normed, rms_norm(hidden + delta, (weight, 1e-5)))


def test_what_our_ops_do_not_take_runs_pytorchs_ops(ops):
    """A norm weight in another dtype than the rows (a model keeping its norms in float32) or
    rows that are not contiguous: PyTorch's ops, the same result, no error."""
    hidden, weight = randn(2, 64, dtype=torch.bfloat16), randn(64, dtype=torch.float32)
    assert torch.equal(add_rms_norm(ops, hidden, (weight, 1e-5))[1], rms_norm(hidden, (weight, 1e-5)))
    strided = randn(64, 2, dtype=torch.float32).t()
    assert torch.equal(add_rms_norm(ops, strided, (weight, 1e-5))[1], rms_norm(strided, (weight, 1e-5)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(ops, dtype):
    gate_up = randn(7, 2 * 1536, dtype=dtype) * 6  # both tails of the exponential
    close(ops.silu_mul(gate_up, 1536), F.silu(gate_up[:, :1536]) * gate_up[:, 1536:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normed", [True, False])
def test_norm_rope_of_strided_heads(ops, dtype, normed):
    """Each head through RMSNorm (q_norm, k_norm) then the rotary, read from a slice of fused
    rows (the drafter's keys beside its values), returned as (B, H, S, D)."""
    batch, s, heads, head_dim = 2, 5, 3, 64
    fused = randn(batch, s, 2 * heads * head_dim, dtype=dtype) * 3
    heads_in = fused[..., : heads * head_dim].view(batch, s, heads, head_dim)  # rows of D, strided
    weight = randn(head_dim, dtype=dtype, seed=1)
    cos, sin = randn(batch, s, head_dim, dtype=dtype, seed=2), randn(batch, s, head_dim, dtype=dtype, seed=3)
    expected = rms_norm(heads_in, (weight, 1e-6)) if normed else heads_in
    ours = ops.norm_rope(heads_in, weight if normed else None, 1e-6, cos, sin)
    close(ours, rope(expected.transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 17, 49152, 50257])
def test_argmax_is_torchs_index_for_index(ops, dtype, width):
    """The first maximum among ties, the first NaN if any, 0 for a row of -inf, -0.0 equal to
    0.0, in the 16-lane body and the tail."""
    rows = torch.randint(-2, 3, (8, width), generator=torch.Generator().manual_seed(width)).to(dtype)
    rows[1] = float("-inf")
    rows[2, -1] = float("inf")
    rows[3, width // 2] = float("nan")
    rows[3, -1] = float("nan")
    rows[4] = -0.0
    rows[4, -1] = 0.0
    rows[5, -1] = float("nan")
    assert torch.equal(kernels.argmax(rows), rows.argmax(-1))
    assert torch.equal(kernels.argmax(rows[6]), rows[6].argmax(-1))  # one row: a 0-d index
    assert torch.equal(kernels.argmax(rows[:, ::2]), rows[:, ::2].argmax(-1))  # strided: torch's


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_writes_keys_and_values_at_their_positions_and_returns_the_query(ops, dtype):
    batch, q, heads, kv_heads, head_dim, start = 2, 3, 6, 2, 64, 5
    qkv = randn(batch, q, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    cos, sin = randn(batch, q, head_dim, dtype=dtype, seed=1), randn(batch, q, head_dim, dtype=dtype, seed=2)
    cache = randn(2, batch, kv_heads, 16, head_dim, dtype=dtype, seed=3)
    before = cache.clone()
    query = ops.rope_into_cache(qkv, cos, sin, cache[0], cache[1], start, heads, kv_heads)
    split = qkv.view(batch, q, heads + 2 * kv_heads, head_dim).transpose(1, 2)
    table = cos.unsqueeze(1), sin.unsqueeze(1)
    close(query, rope(split[:, :heads], *table))
    close(cache[0, :, :, start : start + q], rope(split[:, heads : heads + kv_heads], *table))
    assert torch.equal(cache[1, :, :, start : start + q], split[:, heads + kv_heads :])
    outside = torch.ones(16, dtype=torch.bool)
    outside[start : start + q] = False
    assert torch.equal(cache[:, :, :, outside], before[:, :, :, outside])  # nothing else written


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: its q/k norms before the rotary
def test_the_engine_gives_the_same_logits_with_our_layer_ops_as_with_pytorchs(ops, dtype, arch, monkeypatch):
    # head_dim 32: every op of ours applies (the default tiny model's 16 runs PyTorch's rotary)
    model, tokenizer = build_tiny_target(arch, seed=0, num_heads=2, num_kv_heads=1)
    fast = TargetModel(model.to(dtype), tokenizer, engine="fast").fast
    assert fast.fused_rope
    ids = torch.randint(0, 250, (2, 40), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(40).expand(2, 40)

    def run():
        cache = fast.new_cache(batch=2)
        prefill, _ = fast.forward(ids[:, :37], positions[:, :37], cache, [0, 1])
        step, features = fast.forward(ids[:, 37:], positions[:, 37:], cache, [0, 1])
        return prefill, step, features, cache.keys[:, :, :, :40].clone()

    ours = run()
    monkeypatch.setattr("dflash.engine.forward.layer_ops", lambda like: None)
    theirs = run()
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tolerance)
