"""The drafter's lean decoding forward (dflash.engine.drafter) computes what the module computes:
float32 logits of every propose equal within float rounding over a growing drafter cache,
bfloat16 within its rounding; a decoding loop drafting through it stays lossless."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter
from dflash.engine.drafter import FastDrafter
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import random_drafter


@pytest.fixture(scope="module")
def target() -> TargetModel:
    # head_dim 64 and widths in multiples of 64: the shapes our kernels take (real models' shapes)
    model, tokenizer = build_tiny_target("qwen3", seed=0, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=384)
    return TargetModel(model, tokenizer)


def _drafter(target: TargetModel, use_target_features: bool = True) -> DFlashDrafter:
    return random_drafter(target, 2, 4, seed=1, use_target_features=use_target_features, uneven_norms=True)


def _proposes(target: TargetModel, proposer: DFlashProposer, steps: int = 4) -> list[torch.Tensor]:
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
        out.append(proposer.propose(ids[:, : start + new + 1], chunk, 4, 3))
    return out


@pytest.mark.parametrize("use_target_features", [True, False])
def test_float32_lean_proposes_equal_the_modules(target, use_target_features):
    drafter = _drafter(target, use_target_features)
    module = DFlashProposer(drafter, target.embed, target.logits)
    lean = DFlashProposer(drafter, target.embed, target.logits, lean_dtype=torch.float32)
    assert isinstance(lean.forward, FastDrafter) and module.forward is drafter
    for ours, reference in zip(_proposes(target, lean), _proposes(target, module)):
        scale = reference.abs().max()
        assert float((ours - reference).abs().max() / scale) < 1e-5


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
