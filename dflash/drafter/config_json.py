"""What a drafter directory's config.json holds beyond the drafter's shape, as llama.cpp's
converter and loader read it (build 11434; tests/drafter/test_llamacpp_rules.py): the key names
of each architecture, and the readers of its parts (DSpark's heads, DFlash2's parts, the layer
types and the window), each a ConfigError naming `path` for what we cannot compute.
`DrafterConfig.to_hf_dict` / `from_hf_dict` (dflash.drafter.config) write and read the whole."""

from __future__ import annotations

from dflash.errors import require

# Keys of the target's HF config not copied into the drafter's config.json: per-layer
# structure of the target and loading hooks that would point other programs at the
# target's code or quantization. Rope keys (`TARGET_ROPE_KEYS`) are rewritten.
TARGET_KEYS_NOT_COPIED = ("layer_types", "max_window_layers", "_name_or_path", "auto_map", "quantization_config")

# Top-level keys of a DSpark drafter's config.json (`to_hf_dict`): llama.cpp's converter reads
# `sample_from_anchor` (default true when absent: anchor-first, conversion/qwen.py:941-944) and
# `markov_head_type` (only "vanilla", qwen.py:961-962); the rest are DeepSpec's and
# speculators' names, which we read back. Never copied from a parsed config into another.
DSPARK_KEYS = ("sample_from_anchor", "markov_head_type", "markov_rank", "enable_confidence_head", "confidence_head_with_markov")
DFLASH_ARCHITECTURE = "DFlashDraftModel"
DSPARK_ARCHITECTURE = "DSparkDraftModel"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
# Keys of a DFlash2 drafter's `dflash_config`: llama.cpp's converter needs all four once
# `conv_kernel_size` is there (conversion/qwen.py:770-774) and its loader refuses a draft with a
# selector unless each is > 0 (src/models/dflash.cpp:141-145).
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# The window and in-block causality in config.json, as llama.cpp's converter reads them
# (conversion/qwen.py:803-816): a window needs `use_sliding_window`, `sliding_window` and
# `layer_types` "sliding_attention" (per layer; ours are all sliding); `is_causal` else
# `dflash_config.causal`. The rule they mean: src/llama-hparams.h:480-491 (`masks.py`).
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"


def dspark_heads(data: dict) -> dict:
    """`markov_rank` and `confidence_head` of a drafter config.json (none for DFlash); ConfigError
    for a DSpark variant this drafter cannot compute (anchor-first, a non-vanilla head)."""
    if (data.get("architectures") or [DFLASH_ARCHITECTURE])[0] != DSPARK_ARCHITECTURE:
        return {}
    anchor_first = data.get("sample_from_anchor", True)  # llama.cpp's reading of a missing key
    require(not anchor_first, "path", "anchor-first DSpark drafters (sample_from_anchor true or missing) are not supported")
    head = data.get("markov_head_type", "vanilla")
    require(head == "vanilla", "path", f"markov_head_type {head!r} is not supported; only 'vanilla' is")
    rank = data.get("markov_rank")
    require(isinstance(rank, int) and rank >= 1, "path", f"a DSparkDraftModel config needs markov_rank >= 1, got {rank!r}")
    return {"markov_rank": rank, "confidence_head": bool(data.get("enable_confidence_head", False))}


def dflash2_parts(data: dict) -> dict:
    """The four `dflash_config` keys of a DFlash2DraftModel config.json (none for the others)."""
    if (data.get("architectures") or [DFLASH_ARCHITECTURE])[0] != DFLASH2_ARCHITECTURE:
        return {}
    dflash = data["dflash_config"]
    missing = [key for key in DFLASH2_KEYS if not isinstance(dflash.get(key), int)]
    require(not missing, "path", f"a DFlash2DraftModel config needs dflash_config.{missing[0] if missing else ''} (an integer)")
    return {key: dflash[key] for key in DFLASH2_KEYS}


def require_supported_layers(data: dict) -> None:
    """ConfigError for published drafter variants that this drafter cannot compute."""
    kinds = sorted(set(data.get("layer_types") or []) - {FULL_ATTENTION, SLIDING_ATTENTION})
    require(not kinds, "path", f"drafter layer types {kinds} are not supported; only full_attention and sliding_attention are")
    act = data.get("hidden_act", "silu")
    require(act == "silu", "path", f"hidden_act {act!r} is not supported; DFlash drafter MLPs use silu")


def attention_window(data: dict) -> int | None:
    """The window of a drafter config.json as llama.cpp's converter reads it (qwen.py:803-810);
    ConfigError where it would window some layers only, or where the layer types say sliding and
    it reads no window."""
    dflash = data["dflash_config"]
    size = dflash.get("swa_window_size") or data.get("sliding_window")
    on = bool(data.get("use_sliding_window", False) or dflash.get("use_swa", False)) and bool(size)
    types = data.get("layer_types") or []
    sliding = [True] * data["num_hidden_layers"] if dflash.get("use_swa", False) else [kind == SLIDING_ATTENTION for kind in types]
    if not any(sliding):
        return None
    require(
        on and isinstance(size, int) and size >= 1,
        "path",
        f"sliding_attention layers need use_sliding_window true and sliding_window >= 1, got {data.get('use_sliding_window')!r}, {size!r}",
    )
    require(
        len(sliding) == data["num_hidden_layers"] and all(sliding),
        "path",
        "a window on some layers only (sliding_attention mixed with full_attention) is not supported",
    )
    return size
