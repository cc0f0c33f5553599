"""Drafter: target-layer rule, save/load in the public layout, attention backends, mask token."""

import json

import pytest
import torch

from dflash.drafter import (
    DFlashDrafter,
    DrafterConfig,
    default_target_layer_ids,
    load_drafter,
    resolve_mask_token_id,
    save_drafter,
)
from dflash.errors import ConfigError
from dflash.toy.tiny import byte_tokenizer


@pytest.mark.parametrize(
    "layers, taps, expected",
    [
        (36, 5, [1, 9, 17, 25, 33]),
        (36, 1, [18]),
        (28, 5, [1, 7, 13, 19, 25]),
        (32, 3, [1, 15, 29]),
        (6, 2, [1, 3]),
        (94, 5, [1, 24, 46, 68, 91]),  # half-way points round to even, as published
    ],
)
def test_default_target_layer_rule(layers, taps, expected):
    assert default_target_layer_ids(layers, taps) == expected


def published_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """The published rule, transcribed from `build_target_layer_ids` of the DFlash
    reference (dflash/model.py of z-lab/dflash; the same in SGLang's dflash_utils.py)."""
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + (i * span) / (num_taps - 1))) for i in range(num_taps)]


def test_default_target_layer_rule_equals_the_published_one_on_a_grid():
    half_way_cases = 0  # where rounding half up would pick another layer
    for layers in range(4, 129):
        for taps in range(1, 9):
            if taps > 1 and taps > layers - 4 + 1:  # fewer distinct layers than taps: the published
                with pytest.raises(ConfigError):  # rule would repeat a layer; ours refuses
                    default_target_layer_ids(layers, taps)
                continue
            assert default_target_layer_ids(layers, taps) == published_target_layer_ids(layers, taps), (layers, taps)
            if taps > 1:
                span = layers - 4
                half_way_cases += any(
                    1 + int(span * i / (taps - 1) + 0.5) != v for i, v in enumerate(published_target_layer_ids(layers, taps))
                )
    assert half_way_cases > 0  # the grid exercises the rounding rule


def test_number_of_taps_is_independent_of_depth(qwen3_target):
    config = DrafterConfig.from_target(qwen3_target.config, num_layers=1, block_size=8, mask_token_id=258, num_target_features=3)
    assert config.num_hidden_layers == 1 and config.target_layer_ids == [1, 2, 3]
    drafter = DFlashDrafter(config)
    assert drafter.fc.in_features == 3 * config.hidden_size


def make_drafter(target, **overrides):
    torch.manual_seed(1)
    args = dict(num_layers=2, block_size=8, mask_token_id=258)
    args.update(overrides)
    return DFlashDrafter(DrafterConfig.from_target(target.config, **args))


def drafter_inputs(target, block=8, context=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = target.hidden_size
    return dict(
        block_embeds=torch.randn(1, block, d, generator=g),
        block_positions=torch.arange(context, context + block).unsqueeze(0),
        context_features=torch.randn(1, context, 2 * d, generator=g),
        context_positions=torch.arange(context).unsqueeze(0),
    )


def test_save_load_round_trip_gives_identical_logits(tiny_target, tmp_path):
    drafter = make_drafter(tiny_target).eval()
    inputs = drafter_inputs(tiny_target)
    save_drafter(drafter, str(tmp_path))
    loaded = load_drafter(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(tiny_target.lm_head(drafter(**inputs)), tiny_target.lm_head(loaded(**inputs)))
    assert loaded.config.target_layer_ids == drafter.config.target_layer_ids


def test_saved_directory_uses_the_public_dflash_layout(qwen3_target, tmp_path):
    from safetensors import safe_open

    save_drafter(make_drafter(qwen3_target), str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["block_size"] == 8 and config["num_target_layers"] == qwen3_target.num_layers
    assert config["dflash_config"] == {"target_layer_ids": [1, 3], "mask_token_id": 258, "block_size": 8}
    assert config["num_hidden_layers"] == 2 and config["rope_parameters"]["rope_theta"] == 10000.0
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        expected |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        expected |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {f"layers.{i}.input_layernorm.weight", f"layers.{i}.post_attention_layernorm.weight"}
    assert names == expected  # no embedding, no LM head


def test_llama_rope_scaling_is_carried_into_the_drafter(tmp_path):
    from dflash.toy.tiny import tiny_config

    config = DrafterConfig.from_target(tiny_config("llama"), num_layers=1, block_size=4, mask_token_id=258)
    drafter = DFlashDrafter(config)
    save_drafter(drafter, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"
    assert torch.equal(load_drafter(str(tmp_path)).rotary_emb.inv_freq, drafter.rotary_emb.inv_freq)


def test_flex_attention_gives_the_same_output_as_sdpa(tiny_target):
    sdpa = make_drafter(tiny_target).eval()
    flex = make_drafter(tiny_target, attn_implementation="flex_attention").eval()
    flex.load_state_dict(sdpa.state_dict())
    inputs = drafter_inputs(tiny_target)
    with torch.no_grad():
        torch.testing.assert_close(flex(**inputs), sdpa(**inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-attn needs CUDA")
def test_flash_attention_gives_the_same_output_as_sdpa(tiny_target):
    pytest.importorskip("flash_attn")
    sdpa = make_drafter(tiny_target).eval().cuda().bfloat16()
    flash = make_drafter(tiny_target, attn_implementation="flash_attention_2").eval().cuda().bfloat16()
    flash.load_state_dict(sdpa.state_dict())
    inputs = {k: v.cuda() for k, v in drafter_inputs(tiny_target).items()}
    with torch.no_grad():
        torch.testing.assert_close(flash(**inputs), sdpa(**inputs), atol=2e-2, rtol=2e-2)


def test_block_attention_is_bidirectional_inside_the_block(qwen3_target):
    """Changing the last block token changes the first slot's output (non-causal)."""
    drafter = make_drafter(qwen3_target).eval()
    inputs = drafter_inputs(qwen3_target)
    with torch.no_grad():
        before = drafter(**inputs)[0, 0]
        inputs["block_embeds"][0, -1] += 1.0
        after = drafter(**inputs)[0, 0]
    assert not torch.allclose(before, after)


def test_bad_drafter_configs_name_the_key(qwen3_target):
    with pytest.raises(ConfigError, match="^target_layer_ids: "):  # the field; build_drafter adds the group
        DrafterConfig.from_target(qwen3_target.config, num_layers=1, block_size=4, mask_token_id=258, target_layer_ids=[99])
    with pytest.raises(ConfigError, match="^block_size: "):
        DrafterConfig.from_target(qwen3_target.config, num_layers=1, block_size=0, mask_token_id=258)


def test_mask_token_uses_existing_then_adds_then_errors():
    tok = byte_tokenizer()
    assert resolve_mask_token_id(tok, embedding_rows=300) == tok.convert_tokens_to_ids("<|MASK|>")
    tok = byte_tokenizer(mask_token=False)
    added = resolve_mask_token_id(tok, embedding_rows=300)
    assert tok.mask_token == "<|MASK|>" and added == len(tok) - 1
    with pytest.raises(ConfigError, match="^mask_token: "):
        resolve_mask_token_id(byte_tokenizer(mask_token=False), embedding_rows=len(byte_tokenizer(mask_token=False)))
    tok = byte_tokenizer(mask_token=False)
    named = resolve_mask_token_id(tok, embedding_rows=300, mask_token="<|pad|>")
    assert named == tok.pad_token_id


def test_without_a_spare_row_an_unused_special_token_becomes_the_mask(caplog):
    """SmolLM2 and Llama-3 have no embedding row for a new token: a special token that has
    no role and that the chat template never writes is taken, a reserved one first."""
    import logging

    from dflash.drafter.mask_token import unused_special_token

    tok = byte_tokenizer(chat_template=True, mask_token=False)  # <|im_start|>/<|im_end|> are in the template
    tok.add_tokens(["<legacy_a>", "<legacy_b>"], special_tokens=True)  # as SmolLM2's StarCoder-era tokens
    with caplog.at_level(logging.INFO, logger="dflash.drafter.mask_token"):
        chosen = resolve_mask_token_id(tok, embedding_rows=len(tok))
    assert tok.convert_ids_to_tokens(chosen) == "<legacy_b>" and tok.mask_token == "<legacy_b>"
    assert any("'<legacy_b>'" in r.getMessage() for r in caplog.records)  # says which
    tok = byte_tokenizer(chat_template=True, mask_token=False)
    tok.add_tokens(["<legacy>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>"], special_tokens=True)
    tok.add_special_tokens({"additional_special_tokens": ["<has_a_role>"]})  # listed as special: never taken
    assert unused_special_token(tok, len(tok)) == "<|reserved_special_token_0|>"
    assert unused_special_token(tok, len(tok) - 3) == "<legacy>"  # tokens without an embedding row are not candidates
    tok = byte_tokenizer(chat_template=True, mask_token=False)  # only tokens with a role or in the template
    with pytest.raises(ConfigError, match="no unused special token"):
        resolve_mask_token_id(tok, embedding_rows=len(tok))


def test_standalone_drafter_without_target_features_round_trips_and_decodes_losslessly(tiny_target, tmp_path):
    from dflash.decoding import generate
    from dflash.dflash.proposer import DFlashProposer
    from helpers.decoding import hf_greedy

    drafter = make_drafter(tiny_target, use_target_features=False, num_target_features=2).eval()
    assert drafter.fc is None and drafter.config.target_layer_ids == []
    save_drafter(drafter, str(tmp_path))
    loaded = load_drafter(str(tmp_path))
    assert loaded.config.use_target_features is False
    proposer = DFlashProposer(loaded, tiny_target.embed, tiny_target.logits)
    assert proposer.target_layer_ids is None
    ids = tiny_target.tokenizer("def f(x):\n", return_tensors="pt").input_ids
    result = generate(tiny_target, ids, max_new_tokens=20, block_size=8, proposer=proposer)
    assert result.output_ids == hf_greedy(tiny_target, ids, 20)
