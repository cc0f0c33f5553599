"""A drafter with an attention window or a causal block (`drafter.attention_window`,
`drafter.block_causal`): saved and loaded, decoded losslessly on the engine's lean forward (the
graphed forward refuses it: the module's forward), bad values one line naming the key.

Training equals decoding under both: tests/training/test_equivalence.py; the masks entry by
entry: tests/training/test_masks.py; what llama.cpp reads: tests/drafter/test_llamacpp_rules.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash.decoding import generate
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, load_drafter, save_drafter
from dflash.engine import FastDrafter, GraphedDrafter
from dflash.errors import ConfigError
from dflash.specs import DrafterSpec, build_drafter
from dflash.structured import typed
from helpers.decoding import PROMPTS, hf_greedy

# (window, causal): windows of 3 and 6 bind on the context of every prompt and, at B = 8, on the
# block's own keys; None, True: the causal block alone.
SHAPES = [(3, False), (6, True), (None, True)]


def windowed_drafter(target, window, causal, block_size=8, seed=0):
    spec = DrafterSpec(num_layers=2, block_size=block_size, attention_window=window, block_causal=causal, seed=seed)
    drafter = build_drafter(spec, target).eval()
    with torch.no_grad():  # larger than init weights, so a mask mistake moves the logits clearly
        for parameter in drafter.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.15)
    return drafter


def block_logits(drafter, target, ids, anchors, block_size=8) -> list[torch.Tensor]:
    """The proposer's logits of the blocks at `anchors` (ascending), fed as decoding feeds it."""
    features = target.forward(ids, torch.arange(ids.shape[1]).unsqueeze(0), cache=None, layer_ids=drafter.config.target_layer_ids)
    proposer, seen, out = DFlashProposer(drafter, target.embed, target.logits), 0, []
    for anchor in anchors:
        out.append(proposer.propose(ids[:, : anchor + 1], features.features[:, seen:anchor], block_size, block_size - 1))
        seen = anchor
    return out


@pytest.mark.parametrize("window, causal", SHAPES)
def test_a_windowed_causal_drafter_round_trips(qwen3_target, tmp_path, window, causal):
    drafter = windowed_drafter(qwen3_target, window, causal)
    save_drafter(drafter, str(tmp_path))
    loaded = load_drafter(str(tmp_path))
    assert (loaded.config.attention_window, loaded.config.block_causal) == (window, causal)
    ids = qwen3_target.tokenizer(PROMPTS[3], return_tensors="pt").input_ids
    anchors = [4, 11, 12, 30]
    ours = block_logits(drafter, qwen3_target, ids, anchors)
    for theirs in (block_logits(loaded, qwen3_target, ids, anchors), block_logits(flex(loaded), qwen3_target, ids, anchors)):
        for mine, read in zip(ours, theirs):
            torch.testing.assert_close(read, mine, atol=1e-5, rtol=1e-5)
    # the window and the causal block change the drafts, and without them config.json is the published one
    plain = DFlashDrafter(dataclasses.replace(drafter.config, attention_window=None, block_causal=False)).eval()
    plain.load_state_dict(drafter.state_dict())
    assert max((a - b).abs().max() for a, b in zip(ours, block_logits(plain, qwen3_target, ids, anchors))) > 1e-2
    published = build_drafter(DrafterSpec(num_layers=2, block_size=8), qwen3_target).config.to_hf_dict()
    assert plain.config.to_hf_dict() == published
    assert published["is_causal"] is False and published["use_sliding_window"] is False and "auto_map" in published


def flex(drafter: DFlashDrafter) -> DFlashDrafter:
    """A copy of `drafter` on flex_attention, whose decoding mask then runs SDPA (`attention.attend`)."""
    copy = DFlashDrafter(dataclasses.replace(drafter.config, attn_implementation="flex_attention")).eval()
    copy.load_state_dict(drafter.state_dict())
    return copy


@pytest.mark.parametrize("window, causal", SHAPES)
def test_a_windowed_causal_drafter_decodes_losslessly(tiny_target, window, causal):
    drafter = windowed_drafter(tiny_target, window, causal)
    proposer = DFlashProposer.for_target(drafter, tiny_target)  # the lean forward where the engine runs
    assert isinstance(proposer.forward, FastDrafter)  # the lean forward, in bfloat16
    for prompt, max_new in zip(PROMPTS, [40, 25, 33, 17]):
        ids = tiny_target.tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(tiny_target, ids, max_new_tokens=max_new, block_size=8, proposer=proposer)
        assert result.output_ids == hf_greedy(tiny_target, ids, max_new), prompt
        assert sum(result.acceptance_lengths) + 1 == len(result.output_ids)


def test_the_graphed_forward_refuses_a_window_or_a_causal_block(qwen3_target, caplog):
    for window, causal in SHAPES:
        drafter = windowed_drafter(qwen3_target, window, causal)
        with pytest.raises(ValueError, match="causal block, decodes on the lean or module forward"):
            GraphedDrafter(drafter)
        with caplog.at_level("INFO"):
            proposer = DFlashProposer(drafter, qwen3_target.embed, qwen3_target.logits, graphed=True)
        assert proposer.forward is drafter and "without CUDA graphs" in caplog.text
        lean = DFlashProposer(drafter, qwen3_target.embed, qwen3_target.logits, lean_dtype=torch.float32)
        assert isinstance(lean.forward, FastDrafter)
    plain = build_drafter(DrafterSpec(num_layers=2, block_size=8), qwen3_target)
    assert isinstance(DFlashProposer(plain, qwen3_target.embed, qwen3_target.logits, graphed=True).forward, GraphedDrafter)


@pytest.mark.parametrize("value, message", [(0, "must be >= 1"), (-4, "must be >= 1"), ("wide", "")])
def test_a_bad_window_is_one_line_naming_the_key(qwen3_target, value, message):
    with pytest.raises(ConfigError, match=f"^drafter.attention_window: {message}") as err:
        typed(DrafterSpec, {"attention_window": value}, "drafter")
    assert "\n" not in str(err.value)
    config = build_drafter(DrafterSpec(num_layers=1, block_size=4), qwen3_target).config
    if isinstance(value, int):
        with pytest.raises(ConfigError, match=f"^attention_window: {message}"):  # the field; the builders add the group
            dataclasses.replace(config, attention_window=value)
    with pytest.raises(ConfigError, match="^drafter.block_causal: "):
        typed(DrafterSpec, {"block_causal": "sometimes"}, "drafter")
