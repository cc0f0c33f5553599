"""The frozen target LLM: loading, feature taps, shared embedding and LM head.

Invariants (docs/design.md invariants 1, 2 and 15):
- HF returns `hidden_states[0]` = embeddings, so target layer `i` is tapped at
  `hidden_states[i + 1]`.
- The target never trains: parameters have `requires_grad=False` and the model is in
  eval mode.
- The drafter sees tokens and produces logits exactly as the target does: `embed(ids)`
  is what the target feeds its first layer (Gemma's sqrt(hidden) and Granite's
  embedding multiplier included; a learned absolute position embedding, as GPT-2's, is
  left out: the drafter has rope), and `logits(hidden)` is the target's own head
  transform (lm_head, then Cohere's logit scale, Granite's logit divisor or Gemma's
  final softcapping). Training and decoding both go through these two methods.
- The KV cache keeps every position in every layer, sliding-window layers included:
  verification rewinds the cache after a rejected draft, and a window-sized cache
  cannot be rewound (docs/design.md invariant 15). The attention mask still slides (transformers
  builds it from the config), so outputs equal the target's own.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dflash.engine import HOST_ROPE_TYPES, FastForward, Forward, GraphedForward, StaticCache, fast_engine_refusal
from dflash.errors import ConfigError, reading, require
from dflash.target.engines import ENGINES

log = logging.getLogger(__name__)

# Families whose model forward (not the embedding module) multiplies the embeddings by
# sqrt(hidden_size): Gemma and Gemma2 under transformers 4.x. transformers 5 moved the
# scaling into the embedding module (`*ScaledWordEmbedding`), which `embed` then calls.
_SCALED_IN_FORWARD = ("gemma", "gemma2")

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
    require(name in _DTYPES, "dtype", f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def find_embed_tokens(model: nn.Module) -> nn.Embedding:
    """The token embedding of an HF causal LM (`model.embed_tokens`, GPT-2/Falcon's
    `transformer.wte`/`word_embeddings`, GPT-NeoX's `gpt_neox.embed_in`, ...)."""
    return _hf_module(model, "get_input_embeddings", nn.Embedding, "the token embedding")


def find_lm_head(model: nn.Module) -> nn.Linear:
    """The output projection (LM head) of an HF causal LM (`lm_head`, GPT-NeoX's `embed_out`)."""
    return _hf_module(model, "get_output_embeddings", nn.Linear, "the LM head")


def _hf_module(model: nn.Module, getter: str, kind: type, what: str):
    """`model.<getter>()` if it is a `kind`, else a ConfigError naming `what`."""
    try:
        module = getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        module = None
    if isinstance(module, kind):
        return module
    raise ConfigError(
        "path",
        f"cannot find {what} of {type(model).__name__}: {getter}() gives {type(module).__name__}, not an nn.{kind.__name__}",
    )


# Where HF causal LMs keep their transformer blocks; `_only_layer_list` covers the rest.
_DECODER_LAYER_PATHS = ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers")


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of an HF causal LM."""
    for path in _DECODER_LAYER_PATHS:
        module = module_at(model, path)
        if isinstance(module, nn.ModuleList):
            return module
    module = _only_layer_list(model)
    if module is not None:
        return module
    raise ConfigError(
        "path",
        f"cannot find the decoder layers of {type(model).__name__}: none of {', '.join(_DECODER_LAYER_PATHS)}, "
        "and no single ModuleList of num_hidden_layers blocks in its base model",
    )


def _only_layer_list(model: nn.Module) -> nn.ModuleList | None:
    """The base model's one ModuleList as long as `config.num_hidden_layers`, if there is exactly one."""
    num_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    base = getattr(model, "base_model", model)
    if num_layers is None or not isinstance(base, nn.Module):
        return None
    lists = [m for m in base.children() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    return lists[0] if len(lists) == 1 else None


def supported_attention_implementation(config, requested: str | None) -> str | None:
    """`requested`, unless it is "sdpa" and the model class refuses SDPA (Gemma2: SDPA has
    no attention softcapping); then "eager", with a log line saying so."""
    from transformers import AutoModelForCausalLM

    if requested != "sdpa":
        return requested
    model_class = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if model_class is None or getattr(model_class, "_supports_sdpa", True):
        return requested
    log.info("%s does not support sdpa attention; loading it with eager attention", model_class.__name__)
    return "eager"


def module_at(root: nn.Module, dotted: str) -> nn.Module | None:
    """The submodule of `root` at a dotted path (`self_attn.q_proj`), or None where a part is missing."""
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

    def __init__(self, model: nn.Module, tokenizer=None, engine: str = "auto"):
        require(engine in ENGINES, "engine", f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = model.config
        self.embed_tokens = find_embed_tokens(model)
        self.lm_head = find_lm_head(model)
        self.num_layers = len(find_decoder_layers(model))
        scaled_in_forward = self.config.model_type in _SCALED_IN_FORWARD and not hasattr(self.embed_tokens, "embed_scale")
        self._embedding_scale = self.hidden_size**0.5 if scaled_in_forward else None
        # Config-driven transforms that the families apply in their forward, outside the modules.
        self._embedding_multiplier = getattr(self.config, "embedding_multiplier", None)
        self._logit_scale = getattr(self.config, "logit_scale", None)
        self._logits_divisor = getattr(self.config, "logits_scaling", None)
        self._logit_softcap = getattr(self.config, "final_logit_softcapping", None)
        # transformers >= 5.24 calls the KV cache `cache` (`past_key_values` warns, then goes in 5.40).
        self._cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.fast = self._fast_forward(engine)
        self.graphs = self._graphed(engine)

    def _fast_forward(self, engine: str) -> FastForward | None:
        """The fast engine's forward, or None for the HF forward (one log line says why)."""
        if engine == "eager":
            return None
        if engine == "auto" and self.device.type != "cpu":
            log.info("engine: auto runs the HF forward on %s (target.engine=fast asks for the fast one)", self.device.type)
            return None
        refusal = fast_engine_refusal(self.model)
        if refusal is not None:
            (log.info if engine == "auto" else log.warning)(
                "engine: the fast forward cannot run this target (%s); running the HF forward", refusal
            )
            return None
        return FastForward(self.model)

    def _graphed(self, engine: str) -> Forward | None:
        """The fast forward's decode steps as CUDA graphs (`dflash.engine.graphs`) where
        `engine` is "graphs" and the target is on CUDA, else None (one log line says why)."""
        if engine != "graphs" or self.fast is None:
            return None
        rope = getattr(self.fast.rotary, "rope_type", "default")
        if any(kind in rope for kind in HOST_ROPE_TYPES):
            log.warning("engine: graphs cannot capture %s rope (it reads positions on the host); running the fast forward", rope)
            return None
        if self.device.type != "cuda":
            log.warning("engine: graphs needs CUDA; the target is on %s and runs the fast forward", self.device.type)
            return None
        return GraphedForward(self.fast)

    @property
    def kernel_path(self) -> str:
        """Which forward and kernels decode with: 'hf' or 'fast: <linear kernels chosen>'."""
        if self.fast is None:
            return "hf"
        return f"fast: {(self.graphs or self.fast).kernel_path()}"

    @classmethod
    def load(
        cls,
        path: str,
        dtype: str = "auto",
        attn_implementation: str | None = "sdpa",
        device: str = "cpu",
        engine: str = "auto",
    ) -> TargetModel:
        """Load an HF causal LM and its tokenizer by hub id or local directory.

        Args:
            path: hub id (e.g. "Qwen/Qwen3-8B") or local directory.
            dtype: "auto", "bfloat16", "float16" or "float32".
            attn_implementation: passed to transformers ("sdpa", "eager", "flash_attention_2", ...);
                "sdpa" falls back to "eager" for models that refuse it (Gemma2).
            device: torch device string.
            engine: "auto" (the fast forward, `dflash.engine.forward`, where it can run on a
                CPU; else the HF forward), "fast" (also on CUDA), "graphs" (the fast forward
                with its decode steps as CUDA graphs, `dflash.engine.graphs`; on CUDA only)
                or "eager" (the HF forward).
        """
        from safetensors import SafetensorError
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        path = os.path.expanduser(path)
        # A hub id is "org/name"; anything else that is not an existing directory is a typo.
        looks_local = path.startswith((".", "/")) or path.count("/") > 1
        if looks_local and not os.path.isdir(path):
            raise ConfigError("path", f"directory {path!r} does not exist")
        if os.path.isdir(path):  # without config.json, transformers fails deep in its tokenizer code
            require(
                os.path.isfile(os.path.join(path, "config.json")),
                "path",
                f"{path!r} holds no config.json, so no model; point target.path at a directory that "
                "save_pretrained wrote, or at a hub id",
            )
        torch_dtype = resolve_dtype(dtype)
        # A damaged or foreign model directory, or an unreachable hub id, is the user's to fix.
        fix = "give a complete model directory (save_pretrained's files) or a hub id reachable from this machine"
        with reading("path", path, fix, errors=(OSError, ValueError, SafetensorError)):
            tokenizer = AutoTokenizer.from_pretrained(path)
            config = AutoConfig.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(
                path,
                config=config,
                dtype=torch_dtype,
                attn_implementation=supported_attention_implementation(config, attn_implementation),
            )
        return cls(model.to(device), tokenizer, engine=engine)

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
        """An empty KV cache that keeps every position in every layer (see the module
        invariants): the fast engine's `StaticCache` (its kernels are tuned on the first
        call), else an HF `DynamicCache` built without the config, so sliding-window layers
        get full layers. `forward` runs the fast engine on a `StaticCache`."""
        if self.fast is not None:
            self.fast.prepare()
            return self.fast.new_cache()
        from transformers import DynamicCache

        return DynamicCache()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """What the target's first layer receives for `input_ids` (b, q): (b, q, D) in the
        target's dtype."""
        embeds = self.embed_tokens(input_ids)
        if self._embedding_scale is not None:
            # The same rounding as the family's forward: the scale is cast to the dtype first.
            embeds = embeds * torch.tensor(self._embedding_scale, dtype=embeds.dtype, device=embeds.device)
        if self._embedding_multiplier is not None:
            embeds = embeds * self._embedding_multiplier
        return embeds

    def logits(self, hidden: torch.Tensor, head_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The target's logits for final-normed hidden states (..., D), as float32 (..., V).

        Computed in the head's dtype, like the target's own forward, then upcast.
        head_rows: (K, D) rows of the head's weight (those of K token ids, `head_rows_of`):
            the logits of those tokens only, (..., K), through the same transform.
        """
        if head_rows is not None:
            return self._head_transform(torch.nn.functional.linear(hidden.to(head_rows.dtype), head_rows))
        # the engine's tuned kernels once it has decoded (dense under autograd), else the module
        head = self.fast.lm_head if self.fast is not None and self.fast.prepared else self.lm_head
        return self._head_transform(head(hidden.to(self.lm_head.weight.dtype)))

    def logits_of(self, hidden: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """`logits` of `token_ids` (n, K) only, a set per row of `hidden` (n, D), as float32 (n, K):
        the K head rows of each row instead of the whole head, so a loss over a few candidates
        per row keeps the head's gradient that small (a head with a bias is refused)."""
        rows = self.head_rows_of(token_ids.reshape(-1)).view(*token_ids.shape, -1)  # (n, K, D)
        return self._head_transform(torch.einsum("nd,nkd->nk", hidden.to(rows.dtype), rows))

    @property
    def draft_dtype(self) -> torch.dtype | None:
        """bfloat16 where the fast engine decodes on a CPU (drafters propose in it, as `draft_logits`
        does; docs/design.md invariant 12), else None: the drafter's own (`dflash.engine.drafter`)."""
        return torch.bfloat16 if self.fast is not None and self.device.type == "cpu" else None

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`logits` for a drafter's proposals: through a bfloat16 copy of the head when the fast
        engine decodes a float32 target (half the bytes of the largest matrix a propose
        reads), else `logits` itself. Drafts only propose: the target's own float32 verify
        decides what is emitted, and a sampled draft's acceptance uses these same logits, so
        the output keeps the target's distribution (docs/design.md invariant 12)."""
        if self.fast is None or not self.fast.prepared or self.dtype != torch.float32 or torch.is_grad_enabled():
            return self.logits(hidden)
        return self._head_transform(self.fast.draft_head()(hidden.to(torch.bfloat16)))

    def draft_logits_over(self, token_ids: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """`draft_logits` for a drafter that drafts over `token_ids` (K,) only, its draft
        vocabulary (`DFlashDrafter.draft_vocab`; None: `draft_logits` itself). The head reads
        those K rows, in bfloat16 on our kernels where the fast engine decodes on a CPU (either
        target dtype); every other token gets -inf, so argmaxes and samples stay inside the
        vocabulary, and the logits keep the whole vocabulary's width (..., V)."""
        if token_ids is None:
            return self.draft_logits
        ids = token_ids.to(self.device)
        rows = self.head_rows_of(ids)
        head = self.fast.draft_head(rows) if self.draft_dtype is not None else None
        width = self.lm_head.weight.shape[0]

        def logits(hidden: torch.Tensor) -> torch.Tensor:
            if head is None or torch.is_grad_enabled():
                chosen = self.logits(hidden, head_rows=rows)
            else:
                chosen = self._head_transform(head(hidden.to(torch.bfloat16)))
            out = chosen.new_full((*chosen.shape[:-1], width), float("-inf"))
            out.scatter_(-1, ids.expand_as(chosen), chosen)  # half the time of `out[..., ids] = chosen`
            return out

        return logits

    def _head_transform(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's transform after the head (logit scale, divisor, soft-capping), as float32."""
        if self._logit_scale is not None:
            logits = logits * self._logit_scale
        if self._logits_divisor is not None:
            logits = logits / self._logits_divisor
        if self._logit_softcap is not None:
            logits = torch.tanh(logits / self._logit_softcap) * self._logit_softcap
        return logits.float()

    def head_rows_of(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(K, D) head weight rows of `token_ids` (K,), for `logits(..., head_rows=...)`;
        a head with a bias is refused (no supported family has one)."""
        if self.lm_head.bias is not None:
            raise ValueError("this target's LM head has a bias: its rows alone do not give the logits")
        return self.lm_head.weight.detach()[token_ids.to(self.lm_head.weight.device)]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache=None,
        layer_ids: list[int] | None = None,
        logits_to_keep: int = 0,
        attention_mask: torch.Tensor | None = None,
    ) -> TargetOutput:
        """Run the target on new positions.

        Args:
            input_ids: (batch, q) token ids.
            position_ids: (batch, q) absolute positions.
            cache: HF cache holding the positions before `position_ids[:, 0]`; updated in place.
            layer_ids: target layers to tap (0-based); None for no features.
            logits_to_keep: 0 for logits at every position, k for the last k only.
            attention_mask: None for causal attention; or a custom boolean (True: visible)
                (batch, 1, q, cached + q) mask (tree verification), which the engine's
                attention reads as it is and transformers' (sdpa and eager only) as the
                additive mask made of it here.
        """
        if self.fast is not None and isinstance(cache, StaticCache):
            forward = (self.graphs or self.fast).forward
            logits, features = forward(input_ids, position_ids, cache, layer_ids, logits_to_keep, attention_mask)
            return TargetOutput(logits=logits, features=features)
        if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager attention adds the mask
            blocked = torch.full(attention_mask.shape, torch.finfo(self.dtype).min, dtype=self.dtype, device=attention_mask.device)
            attention_mask = blocked.masked_fill(attention_mask, 0.0)
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            **{self._cache_argument: cache},
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
