"""The frozen target LLM: loading, feature taps, shared embedding and LM head.

Invariants (DESIGN.md, "Getting it right"):
- HF returns `hidden_states[0]` = embeddings, so target layer `i` is tapped at
  `hidden_states[i + 1]`.
- The target never trains: parameters have `requires_grad=False` and the model is in
  eval mode.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from dflash.errors import ConfigError, reading, require

_DTYPES = {
    "auto": "auto",
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(name: str):
    """Map a config dtype name ('auto', 'bfloat16', 'float32', ...) to a torch dtype."""
    require(name in _DTYPES, "target.dtype", f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def find_embed_tokens(model: nn.Module) -> nn.Embedding:
    """The input embedding of an HF causal LM (Qwen3, Llama and most decoder-only families)."""
    for path in ("model.embed_tokens", "model.language_model.embed_tokens", "transformer.wte"):
        module = _get_path(model, path)
        if isinstance(module, nn.Embedding):
            return module
    try:
        module = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        module = None
    if isinstance(module, nn.Embedding):
        return module
    raise ConfigError(
        "target.path",
        f"cannot find the token embedding of {type(model).__name__}; dflash supports "
        "Qwen3/Llama-style models with `model.embed_tokens`",
    )


def find_lm_head(model: nn.Module) -> nn.Linear:
    """The output projection (LM head) of an HF causal LM."""
    module = _get_path(model, "lm_head")
    if not isinstance(module, nn.Linear):
        try:
            module = model.get_output_embeddings()
        except (AttributeError, NotImplementedError):
            module = None
    if isinstance(module, nn.Linear):
        return module
    raise ConfigError(
        "target.path",
        f"cannot find the LM head of {type(model).__name__}; dflash supports "
        "Qwen3/Llama-style models with `lm_head`",
    )


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of an HF causal LM."""
    for path in ("model.layers", "model.language_model.layers", "transformer.h"):
        module = _get_path(model, path)
        if isinstance(module, nn.ModuleList):
            return module
    raise ConfigError("target.path", f"cannot find the decoder layers of {type(model).__name__}")


def _get_path(root: nn.Module, dotted: str):
    module = root
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


@dataclass
class TargetOutput:
    """One target forward.

    logits: (batch, q, vocab) float logits for the q new positions.
    features: (batch, q, n_taps * hidden) concatenated hidden states of the tapped
        layers, or None when no layers were requested.
    """

    logits: torch.Tensor
    features: torch.Tensor | None


class TargetModel:
    """A frozen HF causal LM with feature taps for DFlash.

    Build with `TargetModel.load(...)` or wrap an already-loaded model with
    `TargetModel(model, tokenizer)`.
    """

    def __init__(self, model: nn.Module, tokenizer=None):
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = model.config
        self.embed_tokens = find_embed_tokens(model)
        self.lm_head = find_lm_head(model)
        self.num_layers = len(find_decoder_layers(model))

    @classmethod
    def load(
        cls,
        path: str,
        dtype: str = "auto",
        attn_implementation: str | None = "sdpa",
        device: str = "cpu",
    ) -> "TargetModel":
        """Load an HF causal LM and its tokenizer by hub id or local directory.

        Args:
            path: hub id (e.g. "Qwen/Qwen3-8B") or local directory.
            dtype: "auto", "bfloat16", "float16" or "float32".
            attn_implementation: passed to transformers ("sdpa", "eager", "flash_attention_2", ...).
            device: torch device string.
        """
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = os.path.expanduser(path)
        # A hub id is "org/name"; anything else that is not an existing directory is a typo.
        looks_local = path.startswith((".", "/")) or path.count("/") > 1
        if looks_local and not os.path.isdir(path):
            raise ConfigError("target.path", f"directory {path!r} does not exist")
        if os.path.isdir(path):  # without config.json, transformers fails deep in its tokenizer code
            require(
                os.path.isfile(os.path.join(path, "config.json")),
                "target.path",
                f"{path!r} holds no config.json, so no model; point target.path at a directory that "
                "save_pretrained wrote, or at a hub id",
            )
        torch_dtype = resolve_dtype(dtype)
        # A damaged or foreign model directory, or an unreachable hub id, is the user's to fix.
        fix = "give a complete model directory (save_pretrained's files) or a hub id reachable from this machine"
        with reading("target.path", path, fix, errors=(OSError, ValueError, SafetensorError)):
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
        return cls(model.to(device), tokenizer)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def hidden_size(self) -> int:
        return self.embed_tokens.embedding_dim

    @property
    def embedding_rows(self) -> int:
        return self.embed_tokens.num_embeddings

    def new_cache(self):
        """An empty HF KV cache for this model."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.config)
        except TypeError:  # transformers < 4.56 takes no config
            return DynamicCache()

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache=None,
        layer_ids: list[int] | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """Run the target on new positions.

        Args:
            input_ids: (batch, q) token ids.
            position_ids: (batch, q) absolute positions.
            cache: HF cache holding the positions before `position_ids[:, 0]`; updated in place.
            layer_ids: target layers to tap (0-based); None for no features.
            logits_to_keep: 0 for logits at every position, k for the last k only.
        """
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            output_hidden_states=layer_ids is not None,
            logits_to_keep=logits_to_keep,
        )
        features = None
        if layer_ids is not None:
            features = extract_features(out.hidden_states, layer_ids)
        return TargetOutput(logits=out.logits.float(), features=features)


def extract_features(hidden_states, layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the outputs of target layers `layer_ids` along the hidden dim.

    Args:
        hidden_states: HF tuple of (batch, seq, hidden); entry 0 is the embedding output.
        layer_ids: 0-based layer indices; layer i is `hidden_states[i + 1]`.
    Returns:
        (batch, seq, len(layer_ids) * hidden).
    """
    return torch.cat([hidden_states[layer_id + 1] for layer_id in layer_ids], dim=-1)
