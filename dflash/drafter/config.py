"""Drafter configuration and the target-layer rule.

The drafter has the target's width (hidden size, heads, head dim) and rope settings,
its own depth, and taps `len(target_layer_ids)` target layers; the number of taps is
independent of depth (an ablation varies them separately).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from dflash.drafter.config_json import (
    DFLASH2_ARCHITECTURE,
    DFLASH2_KEYS,
    DFLASH_ARCHITECTURE,
    DSPARK_ARCHITECTURE,
    DSPARK_KEYS,
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    TARGET_KEYS_NOT_COPIED,
    attention_window,
    dflash2_parts,
    dspark_heads,
    require_supported_layers,
)
from dflash.errors import ConfigError, require
from dflash.target.rope_keys import TARGET_ROPE_KEYS, full_attention_rope, rope_config_keys, running_version_keys


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Target layers (0-based) whose outputs feed the drafter.

    One tap: the middle layer `[L // 2]`. Otherwise `num_taps` ids spread evenly from
    layer 1 to layer L-3 (L=36, 5 taps -> [1, 9, 17, 25, 33]). This is the published
    rule (`build_target_layer_ids` of the DFlash reference, also in SGLang): the
    position 1 + i * span / (taps - 1) is rounded as a whole with Python's `round`, i.e.
    half to even (L=94, 5 taps -> [1, 24, 46, 68, 91]).
    """
    require(num_taps >= 1, "num_target_features", f"must be >= 1, got {num_taps}")
    if num_taps == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    require(
        last > first and num_taps <= last - first + 1,
        "num_target_features",
        f"cannot spread {num_taps} taps over layers {first}..{last} of a {num_target_layers}-layer target",
    )
    span = last - first
    return [int(round(first + (i * span) / (num_taps - 1))) for i in range(num_taps)]


@dataclass
class DrafterConfig:
    """Everything needed to build a DFlash drafter.

    `target_config` is the target family's HF config as a dict (model_type, rope
    settings, ...); it is written into the drafter's config.json so that engines that
    serve DFlash drafters recognise the layout. `mask_token` is the string of
    `mask_token_id` (None when unknown); loaders that resolve the mask token through
    the tokenizer (SGLang) read it.
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
    mask_token: str | None = None
    attention_bias: bool = False
    attn_implementation: str = "sdpa"
    use_target_features: bool = True
    markov_rank: int = 0
    """DSpark's Markov head (`dflash.drafter.heads.MarkovHead`) of this rank; 0: none (DFlash)."""
    confidence_head: bool = False
    """DSpark's confidence head (`dflash.drafter.heads.ConfidenceHead`); needs a Markov head."""
    conv_kernel_size: int = 0
    """DFlash2's block-local convolution (`dflash.drafter.heads.GroupedDynamicConv`) of this many
    taps in every layer; 0: none (DFlash). llama.cpp loads it only with the selector."""
    conv_group_size: int = 16
    """Channels sharing one dynamic coefficient; must divide hidden_size (dflash.cpp:146-148)."""
    selector_rank: int = 0
    """DFlash2's candidate selector (`dflash.drafter.heads.CandidateSelector`) of this rank; 0: none."""
    selector_top_k: int = 0
    """Candidates per slot the selector scores; hidden_size >= k·(k+1) (dflash.cpp:149-151)."""
    attention_window: int | None = None
    """llama.cpp's sliding window in every layer: a query at position p1 does not see a key at p0
    when p1 - p0 >= attention_window, context and block keys alike; None: no window."""
    block_causal: bool = False
    """Block slot k sees slots 0..k only (and the context); False: the whole block (bidirectional)."""

    def __post_init__(self):
        self._check_dflash2()
        window = self.attention_window
        require(window is None or window >= 1, "attention_window", f"must be >= 1 (or null: no window), got {window}")
        require(self.markov_rank >= 0, "markov_rank", f"must be >= 0, got {self.markov_rank}")
        require(
            not self.confidence_head or self.markov_rank > 0,
            "confidence_head",
            "reads the Markov head's embedding of the previous token; it needs markov_rank >= 1",
        )
        require(self.block_size >= 1, "block_size", f"must be >= 1, got {self.block_size}")
        require(self.num_hidden_layers >= 1, "num_layers", f"must be >= 1, got {self.num_hidden_layers}")
        if not self.use_target_features:
            # A standalone block-diffusion drafter (ablation): its context is the prefix
            # tokens' own embeddings, not target hidden states.
            self.target_layer_ids = []
        require(
            len(self.target_layer_ids) >= 1 or not self.use_target_features,
            "target_layer_ids",
            "must name at least one target layer",
        )
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        require(
            not bad,
            "target_layer_ids",
            f"{bad} out of range for a {self.num_target_layers}-layer target (valid: 0..{self.num_target_layers - 1})",
        )
        require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            f"{self.num_attention_heads} heads are not a multiple of {self.num_key_value_heads} kv heads",
        )

    def _check_dflash2(self) -> None:
        """llama.cpp's load-time checks of a DFlash2 draft (src/models/dflash.cpp:141-151), and ours."""
        for key in ("conv_kernel_size", "selector_rank", "selector_top_k"):
            require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        if not self.conv_kernel_size and not self.selector_rank:
            require(not self.selector_top_k, "selector_top_k", "needs a selector (selector_rank >= 1)")
            return
        require(
            not self.markov_rank,
            "selector_rank",
            "DSpark (markov_rank) and DFlash2 (selector_rank, conv_kernel_size) heads cannot be combined in one drafter",
        )
        require(
            self.selector_rank >= 1, "selector_rank", "must be >= 1: llama.cpp loads DFlash2's convolution only with its selector"
        )
        require(self.conv_kernel_size >= 1, "conv_kernel_size", f"must be >= 1 for a DFlash2 drafter, got {self.conv_kernel_size}")
        require(self.selector_top_k >= 1, "selector_top_k", f"must be >= 1 for a DFlash2 drafter, got {self.selector_top_k}")
        group = self.conv_group_size
        require(
            group >= 1 and self.hidden_size % group == 0,
            "conv_group_size",
            f"{group} does not divide hidden_size {self.hidden_size} (llama.cpp refuses the draft)",
        )
        k = self.selector_top_k
        require(
            self.hidden_size >= k * (k + 1),
            "selector_top_k",
            f"{k} needs hidden_size >= k*(k+1) = {k * (k + 1)}, got {self.hidden_size} (llama.cpp packs the k x k scores in a hidden row)",
        )
        require(k <= self.vocab_size, "selector_top_k", f"{k} is above the vocabulary size {self.vocab_size}")

    @property
    def dflash2(self) -> bool:
        """A DFlash2 drafter: convolutions in its layers and a candidate selector."""
        return self.selector_rank > 0

    @property
    def masked_decoding(self) -> bool:
        """Decoding masks the block's attention (a window or a causal block): the module and the
        engine's lean forward compute it, the graphed forward attends without a mask."""
        return self.attention_window is not None or self.block_causal

    @property
    def ungraphable(self) -> bool:
        """The engine's graphed forward cannot decode it (DFlash2's convolutions, or a masked
        block): it refuses it and the proposer decodes on the lean or the module forward."""
        return self.dflash2 or self.masked_decoding

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def architecture(self) -> str:
        """config.json's `architectures[0]`: DSparkDraftModel with a Markov head, DFlash2DraftModel
        with a selector, else DFlashDraftModel."""
        if self.dflash2:
            return DFLASH2_ARCHITECTURE
        return DSPARK_ARCHITECTURE if self.markov_rank > 0 else DFLASH_ARCHITECTURE

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
        attention_window: int | None = None,
        block_causal: bool = False,
    ) -> DrafterConfig:
        """A drafter as wide as the target, with `num_layers` layers.

        Whatever the target's family, the drafter is Qwen3-style with the target's width,
        heads, kv heads (1 for Falcon multi-query), head dim, MLP width (else 4x hidden) and
        norm eps, under each family's spelling. `target_config` keeps the target's config with
        its rope settings replaced by the single setting of its full-attention layers
        (`rope_keys.full_attention_rope`) in the running transformers' format, and
        `max_position_embeddings` (GPT-2's `n_positions`).

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
        target_config = {k: v for k, v in tc.to_dict().items() if k not in TARGET_ROPE_KEYS}
        target_config.update(running_version_keys(full_attention_rope(tc.to_dict())))
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
            attention_window=attention_window,
            block_causal=block_causal,
        )

    def to_hf_dict(self) -> dict:
        """The config.json of a drafter directory, in the published DFlash layout.

        The target's config is the base (token ids, ...), overridden by the drafter's
        shape. `model_type` is "qwen3" whatever the target: the drafter's layers are
        Qwen3 layers (q/k norms, SiLU MLP), as published drafters and the engines that
        serve them (docs/drafters.md) have it. Rope settings are written for transformers
        4 and 5 alike (`rope_keys`). A DSpark drafter (`markov_rank` > 0) is a
        DSparkDraftModel with the keys of `DSPARK_KEYS` and no `auto_map`; a DFlash2 drafter
        (`selector_rank` > 0) a DFlash2DraftModel with `DFLASH2_KEYS` in `dflash_config` and no
        `auto_map`. A window or a causal block is written where llama.cpp reads it, without
        `auto_map` too (the shipped dflash.py attends to the whole block and context).
        """
        dropped = TARGET_KEYS_NOT_COPIED + TARGET_ROPE_KEYS + DSPARK_KEYS
        out = {k: v for k, v in copy.deepcopy(self.target_config).items() if k not in dropped}
        out.update(rope_config_keys(self.rope_hf_config()))
        dflash = {
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
            "block_size": self.block_size,
        }
        if self.mask_token is not None:
            dflash["mask_token"] = self.mask_token
        if not self.use_target_features:
            dflash["use_target_features"] = False
        if self.dflash2:  # inside dflash_config, where llama.cpp reads them (qwen.py:770-774)
            dflash.update({key: getattr(self, key) for key in DFLASH2_KEYS})
        if self.architecture == DFLASH_ARCHITECTURE and not self.masked_decoding:  # dflash.py has no heads, no mask
            out["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
        elif self.markov_rank > 0:  # our layout is the bonus anchor: written, since llama.cpp reads a missing key as true
            out.update(
                sample_from_anchor=False,
                markov_head_type="vanilla",
                markov_rank=self.markov_rank,
                enable_confidence_head=self.confidence_head,
                confidence_head_with_markov=True,
            )
        out.update(
            architectures=[self.architecture],
            model_type="qwen3",
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            vocab_size=self.vocab_size,
            attention_bias=self.attention_bias,
            # What we trained (docs/frontier.md 4); vLLM makes every layer causal when is_causal
            # is true or a layer is a sliding-window one.
            is_causal=self.block_causal,
            layer_types=[FULL_ATTENTION if self.attention_window is None else SLIDING_ATTENTION] * self.num_hidden_layers,
            use_sliding_window=self.attention_window is not None,
            block_size=self.block_size,
            num_target_layers=self.num_target_layers,
            dflash_config=dflash,
        )
        if self.attention_window is not None:
            out["sliding_window"] = self.attention_window
        return out

    @classmethod
    def from_hf_dict(cls, data: dict, attn_implementation: str = "sdpa") -> DrafterConfig:
        """Parse a drafter config.json: ours, or a published DFlash drafter's (transformers
        4 rope keys only, `block_size` at the top level or in `dflash_config`)."""
        try:
            dflash = data["dflash_config"]
            block_size = dflash.get("block_size", data.get("block_size"))
            num_target_layers = dflash.get("num_target_layers", data.get("num_target_layers"))
            if block_size is None or num_target_layers is None:
                raise KeyError("block_size" if block_size is None else "num_target_layers")
            require_supported_layers(data)
            window = attention_window(data)
            causal = data.get("is_causal")
            causal = dflash.get("causal", False) if causal is None else causal  # llama.cpp's reading
            dspark = dspark_heads(data)
            dflash2 = dflash2_parts(data)
            return cls(
                hidden_size=data["hidden_size"],
                num_hidden_layers=data["num_hidden_layers"],
                num_attention_heads=data["num_attention_heads"],
                num_key_value_heads=data.get("num_key_value_heads") or data["num_attention_heads"],
                head_dim=data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"],
                intermediate_size=data["intermediate_size"],
                rms_norm_eps=data.get("rms_norm_eps", 1e-6),
                vocab_size=data["vocab_size"],
                block_size=block_size,
                target_layer_ids=list(dflash["target_layer_ids"]),
                mask_token_id=dflash["mask_token_id"],
                num_target_layers=num_target_layers,
                target_config=copy.deepcopy(data),
                mask_token=dflash.get("mask_token"),
                attention_bias=bool(data.get("attention_bias", False)),
                attn_implementation=attn_implementation,
                use_target_features=bool(dflash.get("use_target_features", True)),
                attention_window=window,
                block_causal=bool(causal),
                **dspark,
                **dflash2,
            )
        except KeyError as missing:
            raise ConfigError("path", f"config.json is not a DFlash drafter config (missing {missing})") from None

    def rope_hf_config(self):
        """A Qwen3 HF config with the drafter's rope settings (the target's full-attention
        ones over the whole head dim, `rope_keys.full_attention_rope`), for the rotary module."""
        from transformers import Qwen3Config

        rope = running_version_keys(full_attention_rope(self.target_config))
        return Qwen3Config(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.target_config.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS,
            **rope,
        )


DEFAULT_MAX_POSITIONS = 2048


def _required(config, name: str):
    """`config.name`; every HF causal LM's config has the few read this way (a target
    without them does not load as a `TargetModel` in the first place)."""
    value = getattr(config, name, None)
    if value is None:
        raise ValueError(f"the target's {type(config).__name__} has no {name}; dflash needs it to size the drafter")
    return value


def _first_set(config, *names):
    """The first of `names` that `config` has with a value other than None (else None)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


ATTN_IMPLEMENTATIONS = ("sdpa", "flex_attention", "flash_attention_2")


def check_attn_implementation(name: str) -> None:
    """ConfigError unless the drafter supports attention implementation `name`."""
    require(
        name in ATTN_IMPLEMENTATIONS,
        "attn_implementation",
        f"unknown {name!r}; choose one of {list(ATTN_IMPLEMENTATIONS)}",
    )
