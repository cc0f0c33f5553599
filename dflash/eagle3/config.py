"""EAGLE-3 drafter configuration and its config.json in the layout SGLang and vLLM read.

Invariants:
- The drafter has the target's width, heads, head dim and rope settings, one decoder layer
  (`num_hidden_layers: 1`) and an `fc` that fuses exactly three target layers (low, mid,
  high): the engines size `fc` as 3 x target_hidden_size.
- `target_layer_ids` are 0-based *output* layers (design.md invariant 2). config.json
  carries both engines' spellings: SGLang's `eagle_config.eagle_aux_hidden_state_layer_ids`
  (output layers) and vLLM's top-level `eagle_aux_hidden_state_layer_ids` (our id + 1).
- Draft vocabulary: draft id d is target id `d + d2t[d]` (the weights hold d2t);
  `draft_vocab_size == vocab_size` with d2t = 0 is the full vocabulary (default).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dflash.errors import ConfigError, require
from dflash.target.rope_keys import full_attention_rope, rope_config_keys, running_version_keys

ARCHITECTURE = "LlamaForCausalLMEagle3"
NUM_TAPS = 3
DEFAULT_MAX_POSITIONS = 2048


def default_eagle3_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high taps as output layers: [1, L//2 - 1, L - 4], the defaults of
    SGLang and vLLM ((2, L//2, L-3) as layer inputs); clamped to [0, L-1] for tiny targets."""
    last = num_target_layers - 1
    return [min(max(i, 0), last) for i in (1, num_target_layers // 2 - 1, num_target_layers - 4)]


@dataclass
class Eagle3Config:
    """Everything needed to build an `Eagle3Drafter` (see the module invariants)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    target_layer_ids: list[int]
    rope: dict
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = DEFAULT_MAX_POSITIONS

    def __post_init__(self):
        require(
            len(self.target_layer_ids) == NUM_TAPS,
            "target_layer_ids",
            f"EAGLE-3 fuses exactly {NUM_TAPS} target layers (low, mid, high), got {self.target_layer_ids}",
        )
        require(
            1 <= self.draft_vocab_size <= self.vocab_size,
            "draft_vocab_size",
            f"must be between 1 and the target's vocabulary ({self.vocab_size}), got {self.draft_vocab_size}",
        )

    @classmethod
    def from_target(
        cls,
        target_config,
        target_layer_ids: list[int] | None = None,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
    ) -> Eagle3Config:
        """Size the drafter from the target's HF config (None: the published defaults)."""
        hidden = target_config.hidden_size
        heads = target_config.num_attention_heads
        num_layers = target_config.num_hidden_layers
        ids = list(target_layer_ids) if target_layer_ids is not None else default_eagle3_layer_ids(num_layers)
        bad = [i for i in ids if not 0 <= i < num_layers]
        require(not bad, "target_layer_ids", f"{bad} outside the target's layers 0..{num_layers - 1}")
        vocab = target_config.vocab_size
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
            intermediate_size=intermediate_size or target_config.intermediate_size,
            vocab_size=vocab,
            draft_vocab_size=draft_vocab_size or vocab,
            target_hidden_size=hidden,
            target_layer_ids=ids,
            rope=full_attention_rope(target_config.to_dict()),
            rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
            max_position_embeddings=getattr(target_config, "max_position_embeddings", None) or DEFAULT_MAX_POSITIONS,
        )

    def rope_hf_config(self):
        """A Llama HF config carrying the rope settings, for `LlamaRotaryEmbedding`."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            **running_version_keys(self.rope),
        )

    def to_hf_dict(self) -> dict:
        """config.json: a one-layer Llama config plus the EAGLE-3 keys the engines read."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            **rope_config_keys(self.rope_hf_config()),
            # vLLM: index of the target layer whose input is captured (our output id + 1).
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in self.target_layer_ids],
            # SGLang: output layers (it adds 1 itself).
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.target_layer_ids), "use_aux_hidden_state": True},
            "dflash_eagle3": asdict(self),  # our own exact copy, read back by `from_hf_dict`
        }

    @classmethod
    def from_hf_dict(cls, data: dict) -> Eagle3Config:
        """Read a config.json written by `to_hf_dict`."""
        require(
            ARCHITECTURE in (data.get("architectures") or []) and "dflash_eagle3" in data,
            "path",
            f"config.json is not an EAGLE-3 drafter written by dflash (architectures {data.get('architectures')})",
        )
        try:
            return cls(**data["dflash_eagle3"])
        except TypeError as err:
            raise ConfigError("path", f"config.json has a damaged dflash_eagle3 entry ({err})") from None
