"""Rope settings in config.json that transformers 4.x and 5.x read the same way.

transformers 5 keeps every rope setting in one flat dict, `rope_parameters`
({rope_type, rope_theta, factor, ...}); transformers 4 reads `rope_theta` and
`rope_scaling` (the same dict without the theta, or null for plain rope) and ignores
`rope_parameters`. A config.json with only one generation's keys is read by the other
as plain rope with theta 10000: different frequencies, no error. So a drafter's
config.json carries both, derived from the one rope config the drafter itself uses.
"""

from __future__ import annotations


def rope_parameters_of(rope_config) -> dict:
    """The flat rope dict {rope_type, rope_theta, ...} of an HF config object, built under
    either transformers generation (v5: `rope_parameters`; v4: `rope_theta` + `rope_scaling`)."""
    params = getattr(rope_config, "rope_parameters", None)
    if params and "rope_theta" in params:
        params = dict(params)
    else:
        params = dict(getattr(rope_config, "rope_scaling", None) or {})
        legacy_type = params.pop("type", None)  # transformers 4 also accepts this older spelling
        params["rope_type"] = params.get("rope_type") or legacy_type or "default"
        params["rope_theta"] = rope_config.rope_theta
    params.setdefault("rope_type", "default")
    partial = getattr(rope_config, "partial_rotary_factor", None)
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    return params


def rope_config_keys(rope_config) -> dict:
    """config.json keys giving `rope_config`'s rotary embedding under transformers 4 and 5.

    Returns `rope_parameters` (v5), `rope_theta` and `rope_scaling` (v4),
    `max_position_embeddings` (dynamic and yarn scaling read it) and, when set,
    `partial_rotary_factor` (v4 reads it at the top level); for longrope also the
    top-level `original_max_position_embeddings` and an explicit `attention_factor`.
    """
    params = rope_parameters_of(rope_config)
    top_level = {}
    if params["rope_type"] == "longrope":
        # transformers 4 takes longrope's pretraining length from the top level and derives
        # its attention factor from it; transformers 5 reads both from the rope dict. Pin them.
        top_level["original_max_position_embeddings"] = params["original_max_position_embeddings"]
        params.setdefault("attention_factor", _attention_scaling(rope_config))
    scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
    keys = {
        "rope_parameters": params,
        "rope_theta": params["rope_theta"],
        "rope_scaling": scaling,
        "max_position_embeddings": rope_config.max_position_embeddings,
    }
    if "partial_rotary_factor" in params:
        keys["partial_rotary_factor"] = params["partial_rotary_factor"]
    return {**keys, **top_level}


def _attention_scaling(rope_config) -> float:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return float(LlamaRotaryEmbedding(rope_config).attention_scaling)
