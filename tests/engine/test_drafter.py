"""The drafter's lean decoding forward (dflash.engine.drafter) computes what the module computes:
float32 logits of every propose equal within float rounding over a growing drafter cache,
bfloat16 within its rounding, DFlash2's convolutions and a window or a causal block included;
`lean_linears` copies (DSpark's Markov head, EAGLE-3) compute the module's linears; a decoding
loop drafting through any of them stays lossless."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter
from dflash.dspark.proposer import DSparkProposer
from dflash.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Proposer
from dflash.engine.drafter import FastDrafter, lean_linears
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import RecordingProposer, dspark_drafter, random_drafter


@pytest.fixture(scope="module")
def target() -> TargetModel:
    # head_dim 64 and widths in multiples of 64: the shapes our kernels take (real models' shapes)
    model, tokenizer = build_tiny_target("qwen3", seed=0, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=384)
    return TargetModel(model, tokenizer)


def _drafter(target: TargetModel, use_target_features: bool = True) -> DFlashDrafter:
    return random_drafter(target, 2, 4, seed=1, use_target_features=use_target_features, uneven_norms=True)


def _proposes(target: TargetModel, proposer: DFlashProposer, steps: int = 4, block_size: int = 4) -> list[torch.Tensor]:
    """The logits of `steps` proposes, each after 1-3 new context positions, as decoding feeds them."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (1, 40), generator=generator)
    layers = proposer.target_layer_ids
    with torch.inference_mode():
        features = target.forward(ids, torch.arange(40).unsqueeze(0), target.new_cache(), layers).features
    proposer.reset()
    out, seen = [], 20
    for step in range(steps):
        new = seen if step == 0 else 1 + step % 3
        start = proposer.cache.length
        chunk = None if features is None else features[:, start : start + new]
        out.append(proposer.propose(ids[:, : start + new + 1], chunk, block_size, block_size - 1))
    return out


def _assert_lean_equals_module(target, drafter, block_size=4, dtype=torch.float32, tolerance=1e-5):
    module = DFlashProposer(drafter, target.embed, target.logits)
    lean = DFlashProposer(drafter, target.embed, target.logits, lean_dtype=dtype)
    assert isinstance(lean.forward, FastDrafter) and module.forward is drafter
    for ours, reference in zip(_proposes(target, lean, block_size=block_size), _proposes(target, module, block_size=block_size)):
        assert float((ours - reference).abs().max() / reference.abs().max()) < tolerance


@pytest.mark.parametrize("use_target_features", [True, False])
def test_float32_lean_proposes_equal_the_modules(target, use_target_features):
    _assert_lean_equals_module(target, _drafter(target, use_target_features))


@pytest.mark.parametrize("block_size", [3, 8])
def test_lean_proposes_of_a_dflash2_drafter_equal_the_modules(target, block_size):
    drafter = _drafter(target)
    drafter.add_dflash2_parts(kernel_size=4, group_size=64, rank=8, top_k=4)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # not the identity start: every tap and side of every convolution counts
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                for parameter in (conv.base_kernel, conv.kernel_projection.weight):
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    _assert_lean_equals_module(target, drafter, block_size)
    # bfloat16: its rounding, which the random convolutions amplify
    _assert_lean_equals_module(target, drafter, block_size, torch.bfloat16, 0.3)


@pytest.mark.parametrize("window, causal", [(5, False), (None, True)])
@pytest.mark.parametrize("our_attention", [True, False])
def test_lean_proposes_under_a_window_or_a_causal_block_equal_the_modules(target, window, causal, our_attention, monkeypatch):
    if not our_attention:  # SDPA's path, as where our attention kernel does not apply
        monkeypatch.setattr("dflash.engine.drafter.attention_plan", lambda *args: None)
    plain = _drafter(target)
    drafter = DFlashDrafter(dataclasses.replace(plain.config, attention_window=window, block_causal=causal)).eval()
    drafter.load_state_dict(plain.state_dict())
    _assert_lean_equals_module(target, drafter, block_size=8)  # the window binds on the context and the block


def test_bfloat16_lean_proposes_are_the_modules_to_bfloat16_rounding(target):
    drafter = _drafter(target)
    module = DFlashProposer(drafter, target.embed, target.logits)
    lean = DFlashProposer(drafter, target.embed, target.logits, lean_dtype=torch.bfloat16)
    for ours, reference in zip(_proposes(target, lean), _proposes(target, module)):
        assert float((ours - reference).abs().max() / reference.abs().max()) < 0.05


def test_decoding_with_the_lean_drafter_is_the_targets_greedy_output(target):
    drafter = _drafter(target)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    plain = generate(target, ids, max_new_tokens=40).output_ids
    proposer = DFlashProposer(drafter, target.embed, target.draft_logits, target.draft_dtype)
    assert target.draft_dtype == torch.bfloat16 and isinstance(proposer.forward, FastDrafter)
    assert generate(target, ids, max_new_tokens=40, block_size=4, proposer=proposer).output_ids == plain


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_lean_linears_compute_the_modules_linears_and_leave_it_as_it_is(target, dtype, tolerance):
    drafter = dspark_drafter(target, rank=8, block_size=4, markov_scale=1.0)
    markov = drafter.markov_head
    lean = lean_linears(markov, dtype)
    assert isinstance(markov.markov_w2, torch.nn.Linear) and not any(isinstance(m, torch.nn.Linear) for m in lean.modules())
    assert lean.markov_w1.weight is markov.markov_w1.weight  # what is not a linear is shared, not copied
    with torch.inference_mode():
        for embedded in markov.embed(torch.arange(6)):
            ours, reference = lean.bias(embedded), markov.bias(embedded)
            assert ours.dtype == torch.float32 and ours.shape == reference.shape
            assert float((ours - reference).abs().max() / reference.abs().max()) < tolerance
    biased = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.SiLU(), torch.nn.Linear(96, 32))  # biases, nested
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours, reference = lean_linears(biased, dtype)(x), biased(x)
    assert ours.dtype == torch.float32 and float((ours - reference).abs().max() / reference.abs().max()) < tolerance


def _eagle3_proposer(target, lean_dtype=None):
    torch.manual_seed(0)
    config = Eagle3Config.from_target(target.config, target_layer_ids=[0, 1, 2])
    return Eagle3Proposer(Eagle3Drafter(config), target.embed, lean_dtype)


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_lean_drafting_modules_draft_the_modules_tokens_without_torch_linears(target, method, monkeypatch):
    """DSpark's Markov bias (here larger than the logits, so it picks the drafts) and EAGLE-3's
    drafter draft through `lean_linears` copies: in float32 the module's tokens, never a PyTorch
    linear, and decoding stays the target's greedy output (bfloat16: tests/eagle3, tests/dspark)."""
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    plain = generate(target, ids, max_new_tokens=40).output_ids
    if method == "dspark":
        drafter = dspark_drafter(target, rank=8, block_size=4, markov_scale=1.0)
        module, lean = (DSparkProposer(drafter, target.embed, target.logits, dtype) for dtype in (None, torch.float32))
    else:
        module, lean = (_eagle3_proposer(target, dtype) for dtype in (None, torch.float32))

    def drafts(proposer) -> list[list[int]]:
        recording = RecordingProposer(proposer)
        assert generate(target, ids, max_new_tokens=40, block_size=4, proposer=recording).output_ids == plain
        return recording.drafts

    expected = drafts(module)

    def refused(*args):
        raise AssertionError("a lean proposer ran a PyTorch linear")

    monkeypatch.setattr(torch.nn.Linear, "forward", refused)
    assert drafts(lean) == expected and any(len(draft) > 0 for draft in expected)
