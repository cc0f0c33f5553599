"""Drafter configuration and the target-layer rule.

The drafter has the target's width (hidden size, heads, head dim) and rope settings,
its own depth, and taps `len(target_layer_ids)` target layers; the number of taps is
independent of depth (an ablation varies them separately).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from dflash.errors import ConfigError, require

# Keys of the target's HF config that the drafter overrides or that describe per-layer
# structure of the target; everything else (rope settings, eps, ...) is inherited.
_PER_LAYER_KEYS = ("layer_types", "max_window_layers")


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Target layers (0-based) whose outputs feed the drafter.

    One tap: the middle layer `[L // 2]`. Otherwise `num_taps` ids spread evenly from
    layer 1 to layer L-3, rounded (L=36, 5 taps -> [1, 9, 17, 25, 33]).
    """
    require(num_taps >= 1, "drafter.num_target_features", f"must be >= 1, got {num_taps}")
    if num_taps == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    require(
        last > first and num_taps <= last - first + 1,
        "drafter.num_target_features",
        f"cannot spread {num_taps} taps over layers {first}..{last} of a {num_target_layers}-layer target",
    )
    span = last - first
    return [int(first + round(span * i / (num_taps - 1))) for i in range(num_taps)]


@dataclass
class DrafterConfig:
    """Everything needed to build a DFlash drafter.

    `target_config` is the target family's HF config as a dict (model_type, rope
    settings, ...); it is written into the drafter's config.json so that engines that
    serve DFlash drafters recognise the layout.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    num_target_layers: int
    target_config: dict = field(default_factory=dict)
    attention_bias: bool = False
    attn_implementation: str = "sdpa"
    use_target_features: bool = True

    def __post_init__(self):
        require(self.block_size >= 1, "drafter.block_size", f"must be >= 1, got {self.block_size}")
        require(self.num_hidden_layers >= 1, "drafter.num_layers", f"must be >= 1, got {self.num_hidden_layers}")
        if not self.use_target_features:
            # A standalone block-diffusion drafter (ablation): its context is the prefix
            # tokens' own embeddings, not target hidden states.
            self.target_layer_ids = []
        require(
            len(self.target_layer_ids) >= 1 or not self.use_target_features,
            "drafter.target_layer_ids",
            "must name at least one target layer",
        )
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        require(
            not bad,
            "drafter.target_layer_ids",
            f"{bad} out of range for a {self.num_target_layers}-layer target (valid: 0..{self.num_target_layers - 1})",
        )
        require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "drafter.num_key_value_heads",
            f"{self.num_attention_heads} heads are not a multiple of {self.num_key_value_heads} kv heads",
        )
        check_attn_implementation(self.attn_implementation)

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_target(
        cls,
        target_hf_config,
        *,
        num_layers: int,
        block_size: int,
        mask_token_id: int,
        target_layer_ids: list[int] | None = None,
        num_target_features: int | None = None,
        intermediate_size: int | None = None,
        attn_implementation: str = "sdpa",
        use_target_features: bool = True,
    ) -> "DrafterConfig":
        """A drafter as wide as the target, with `num_layers` layers.

        Whatever the target's family, the drafter is Qwen3-style: it takes the target's
        width, heads, kv heads (1 for Falcon multi-query) and head dim; intermediate size
        from `intermediate_size` / `ffn_hidden_size` / `n_inner`, else 4x hidden; eps from
        `rms_norm_eps` / `layer_norm_eps` / `layer_norm_epsilon`. `target_config` keeps
        the target's config with its rope settings replaced by the single setting of its
        full-attention layers (see `_full_attention_rope`) in the running transformers'
        format, and `max_position_embeddings` (GPT-2's `n_positions`).

        Args:
            target_hf_config: the target's `transformers` config object.
            target_layer_ids: explicit taps; else `num_target_features` taps by the
                default rule (default: as many taps as drafter layers, as published).
        """
        tc = target_hf_config
        num_target_layers = _required(tc, "num_hidden_layers")
        if not use_target_features:
            target_layer_ids = []
        elif target_layer_ids is None:
            taps = num_target_features if num_target_features is not None else num_layers
            target_layer_ids = default_target_layer_ids(num_target_layers, taps)
        hidden_size, num_heads = _required(tc, "hidden_size"), _required(tc, "num_attention_heads")
        # Family spellings: Llama-style names first, then GPT-2's / Falcon's.
        num_kv_heads = _first_set(tc, "num_key_value_heads", "num_kv_heads") or num_heads
        if getattr(tc, "multi_query", False) and not getattr(tc, "new_decoder_architecture", False):
            num_kv_heads = 1  # Falcon-7B style multi-query attention
        target_intermediate = _first_set(tc, "intermediate_size", "ffn_hidden_size", "n_inner") or 4 * hidden_size
        target_config = {k: v for k, v in tc.to_dict().items() if k not in _TARGET_ROPE_KEYS}
        target_config.update(_rope_config_keys(_full_attention_rope(tc.to_dict())))
        target_config["max_position_embeddings"] = _first_set(tc, "max_position_embeddings", "n_positions")
        return cls(
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=getattr(tc, "head_dim", None) or hidden_size // num_heads,
            intermediate_size=intermediate_size or target_intermediate,
            rms_norm_eps=_first_set(tc, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon") or 1e-6,
            vocab_size=_required(tc, "vocab_size"),
            block_size=block_size,
            target_layer_ids=list(target_layer_ids),
            mask_token_id=mask_token_id,
            num_target_layers=num_target_layers,
            target_config=target_config,
            attention_bias=bool(getattr(tc, "attention_bias", False)),
            attn_implementation=attn_implementation,
            use_target_features=use_target_features,
        )

    def to_hf_dict(self) -> dict:
        """The config.json of a drafter directory (public DFlash layout)."""
        out = {k: v for k, v in copy.deepcopy(self.target_config).items() if k not in _PER_LAYER_KEYS}
        for key in ("_name_or_path", "auto_map", "quantization_config"):
            out.pop(key, None)
        out.update(
            architectures=["DFlashDraftModel"],
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            vocab_size=self.vocab_size,
            attention_bias=self.attention_bias,
            block_size=self.block_size,
            num_target_layers=self.num_target_layers,
            dflash_config={"target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id},
        )
        if not self.use_target_features:
            out["dflash_config"]["use_target_features"] = False
        if "layer_types" in self.target_config:
            out["layer_types"] = ["full_attention"] * self.num_hidden_layers
        return out

    @classmethod
    def from_hf_dict(cls, data: dict, attn_implementation: str = "sdpa") -> "DrafterConfig":
        """Parse a drafter config.json (ours or a public DFlash drafter's)."""
        try:
            dflash = data["dflash_config"]
            return cls(
                hidden_size=data["hidden_size"],
                num_hidden_layers=data["num_hidden_layers"],
                num_attention_heads=data["num_attention_heads"],
                num_key_value_heads=data.get("num_key_value_heads") or data["num_attention_heads"],
                head_dim=data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"],
                intermediate_size=data["intermediate_size"],
                rms_norm_eps=data.get("rms_norm_eps", 1e-6),
                vocab_size=data["vocab_size"],
                block_size=data["block_size"],
                target_layer_ids=list(dflash["target_layer_ids"]),
                mask_token_id=dflash["mask_token_id"],
                num_target_layers=data["num_target_layers"],
                target_config=data,
                attention_bias=bool(data.get("attention_bias", False)),
                attn_implementation=attn_implementation,
                use_target_features=bool(dflash.get("use_target_features", True)),
            )
        except KeyError as missing:
            raise ConfigError("drafter.path", f"config.json is not a DFlash drafter config (missing {missing})") from None

    def rope_hf_config(self):
        """A Qwen3 HF config with the drafter's rope settings, for the rotary module.

        The drafter is Qwen3-style whatever the target: its layers are full attention and
        rotate the whole head dim, so it takes the target's full-attention rope settings
        (or a default for targets without rope; see `_full_attention_rope`).
        """
        from transformers import Qwen3Config

        rope = _rope_config_keys(_full_attention_rope(self.target_config))
        return Qwen3Config(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.target_config.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS,
            **rope,
        )


# Every key under which a family keeps rope settings (v4 and v5 spellings). The drafter
# replaces them all by one full-attention setting in the running version's format.
_TARGET_ROPE_KEYS = (
    "rope_parameters",
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "rotary_pct",
    "rotary_emb_base",
    "rope_local_base_freq",
)
# Rope for targets without any (GPT-2's learned positions, Falcon's ALiBi): the original
# RoPE paper's theta, which Llama-1/2 and GPT-NeoX also use.
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_MAX_POSITIONS = 2048


def _required(config, name: str):
    """`config.name`, or a ConfigError naming what the target's config lacks."""
    value = getattr(config, name, None)
    require(
        value is not None,
        "target.path",
        f"the target's {type(config).__name__} has no {name}; dflash needs it to size the drafter",
    )
    return value


def _first_set(config, *names):
    """The first of `names` that `config` has with a value other than None (else None)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def _full_attention_rope(config: dict) -> dict:
    """One rope setting {"rope_type", "rope_theta", scaling keys...} for full-attention layers.

    Reads transformers-5 `rope_parameters` (flat, or keyed by layer type as Gemma3's:
    the "full_attention" entry) or transformers-4 `rope_theta` / `rope_scaling` (and
    GPT-NeoX's `rotary_emb_base`). `partial_rotary_factor` is dropped: the drafter
    rotates whole heads.
    """
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and parameters:
        if all(isinstance(v, dict) or v is None for v in parameters.values()):
            if not isinstance(parameters.get("full_attention"), dict):
                raise ConfigError(
                    "target.path",
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


def _rope_config_keys(rope: dict) -> dict:
    """HF config keys carrying `rope` in the running transformers' format: v5
    `rope_parameters`, v4 `rope_theta` + `rope_scaling`."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": dict(rope)}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_theta": rope["rope_theta"], "rope_scaling": scaling if scaling["rope_type"] != "default" else None}


ATTN_IMPLEMENTATIONS = ("sdpa", "flex_attention", "flash_attention_2")


def check_attn_implementation(name: str) -> None:
    """ConfigError unless the drafter supports attention implementation `name`."""
    require(
        name in ATTN_IMPLEMENTATIONS,
        "drafter.attn_implementation",
        f"unknown {name!r}; choose one of {list(ATTN_IMPLEMENTATIONS)}",
    )
