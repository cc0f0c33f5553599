"""Rope settings: one full-attention setting read from any target config, written so that
transformers 4.x and 5.x compute the same frequencies.

Reading (`full_attention_rope`): families keep rope settings under transformers-5
`rope_parameters` (flat, or keyed by layer type as Gemma3's), transformers-4
`rope_theta` / `rope_scaling` (with `rope_type` or the older `type`), or their own names
(GPT-NeoX's `rotary_emb_base`); targets without rope (GPT-2's learned positions,
Falcon's ALiBi) get theta 10000. The drafter's layers are full attention and rotate
whole heads, so it takes one flat setting {rope_type, rope_theta, scaling keys...}.

Writing: transformers 5 reads `rope_parameters`, transformers 4 `rope_theta` and `rope_scaling`;
each reads a config with only the other's keys as plain rope with theta 10000, silently. So a
drafter's config.json carries both (`rope_config_keys`); the rope config the drafter builds in
memory uses the running version's (`running_version_keys`).
"""

from __future__ import annotations

from dflash.errors import ConfigError

# Every key under which a family keeps rope settings (v4 and v5 spellings). The drafter
# replaces them all by one full-attention setting.
TARGET_ROPE_KEYS = (
    "rope_parameters",
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "rotary_pct",
    "rotary_emb_base",
    "rope_local_base_freq",
)
# Rope for targets without any: the original RoPE paper's theta, which Llama-1/2 and
# GPT-NeoX also use.
DEFAULT_ROPE_THETA = 10000.0


def full_attention_rope(config: dict) -> dict:
    """One rope setting {"rope_type", "rope_theta", scaling keys...} for full-attention layers.

    Args:
        config: an HF config as a dict (`config.to_dict()`), of either transformers
            generation. `partial_rotary_factor` is dropped: the drafter rotates whole heads.
    """
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and parameters:
        if all(isinstance(v, dict) or v is None for v in parameters.values()):
            if not isinstance(parameters.get("full_attention"), dict):
                raise ConfigError(
                    "path",
                    f"rope settings keyed by layer type {sorted(parameters)} have no 'full_attention' entry for the drafter",
                )
            parameters = parameters["full_attention"]
        rope = dict(parameters)
    else:
        rope = dict(config.get("rope_scaling") or {})
        theta = config.get("rope_theta") or config.get("rotary_emb_base")
        if theta is not None:
            rope.setdefault("rope_theta", theta)
    legacy_type = rope.pop("type", None)  # transformers < 4.45 spelling
    rope["rope_type"] = rope.get("rope_type") or legacy_type or "default"
    rope.setdefault("rope_theta", DEFAULT_ROPE_THETA)
    rope.pop("partial_rotary_factor", None)
    return rope


def running_version_keys(rope: dict) -> dict:
    """HF config keys carrying `rope` (a `full_attention_rope` dict) in the running
    transformers' format: v5 `rope_parameters`, v4 `rope_theta` + `rope_scaling`."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": dict(rope)}
    return {"rope_theta": rope["rope_theta"], "rope_scaling": _scaling(rope)}


def rope_config_keys(rope_config) -> dict:
    """config.json keys giving `rope_config`'s rotary embedding under transformers 4 and 5.

    Args:
        rope_config: the HF config the drafter's rotary module is built from (either
            transformers generation; anything with `to_dict()` and `max_position_embeddings`).
    Returns `rope_parameters` (v5), `rope_theta` and `rope_scaling` (v4) and
    `max_position_embeddings` (dynamic and yarn scaling read it); for longrope also the
    top-level `original_max_position_embeddings` and an explicit `attention_factor`.
    """
    params = full_attention_rope(rope_config.to_dict())
    top_level = {}
    if params["rope_type"] == "longrope":
        # transformers 4 takes longrope's pretraining length from the top level and derives
        # its attention factor from it; transformers 5 reads both from the rope dict. Pin them.
        top_level["original_max_position_embeddings"] = params["original_max_position_embeddings"]
        params.setdefault("attention_factor", _attention_scaling(rope_config))
    keys = {
        "rope_parameters": params,
        "rope_theta": params["rope_theta"],
        "rope_scaling": _scaling(params),
        "max_position_embeddings": rope_config.max_position_embeddings,
    }
    return {**keys, **top_level}


def _scaling(rope: dict) -> dict | None:
    """transformers 4's `rope_scaling`: the rope dict without the theta; None for plain rope."""
    return None if rope["rope_type"] == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}


def _attention_scaling(rope_config) -> float:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return float(LlamaRotaryEmbedding(rope_config).attention_scaling)
