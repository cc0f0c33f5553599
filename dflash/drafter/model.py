"""The DFlash drafter: Qwen3-style layers with target-feature KV injection.

Invariants (docs/design.md invariants 1, 3, 4 and 5):
- Block slot k (k = 0 is the anchor) sits at position anchor_pos + k and its output
  predicts the token at that position; slot 0 is never a prediction.
- Context features come from target positions strictly before the anchor. The drafter
  does not enforce this: callers pass only such features (decoding) or a mask that
  hides the rest (training).
- The drafter owns no embedding and no LM head; it reads the target's, frozen.

Per layer: context c = hidden_norm(fc(concat target features)) is projected by that
layer's own k/v projections (and k_norm, rope at the context positions) and placed in
front of the block's keys/values. Block queries attend to context and block alike,
bidirectionally inside the block.

A drafter with a window or a causal block (`DrafterConfig.masked_decoding`) decodes under a
dense mask of llama.cpp's rule over positions (`attention.sees_by_position`), the rule its
training mask applies (`dflash.training.masks`; docs/design.md invariant 6). The key positions
are those of the `DrafterCache` (context [0, length)), the new context's and the block's.

A DFlash2 drafter (`DrafterConfig.dflash2`) convolves each layer's block rows around attention
and around the MLP, one block at a time, where llama.cpp does (src/models/dflash.cpp:704-796;
`heads.GroupedDynamicConv`); context rows never. In training (a mask given) the blocks are the
query rows j·B .. j·B + B - 1; in decoding (no mask) all query rows are one block, whatever the
verify width, as llama.cpp's draft block is.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from dflash.drafter.attention import attend, sees_by_position
from dflash.drafter.config import DrafterConfig
from dflash.drafter.heads import CandidateSelector, ConfidenceHead, GroupedDynamicConv, MarkovHead
from dflash.engine import apply_rope


class RMSNorm(nn.Module):
    """RMS normalisation computed in float32, as in Qwen3/Llama."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class DrafterCache:
    """Keys/values of the drafter's context, one entry per layer.

    Holds context positions [0, length); a decoding step appends new context and the
    block, then `crop(anchor_pos)` drops the block again.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (batch, kv_heads, new, head_dim) keys/values; return the full ones."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first `length` positions."""
        for layer, k in enumerate(self.keys):
            if k is not None:
                self.keys[layer] = k[:, :, :length]
                self.values[layer] = self.values[layer][:, :, :length]


class DrafterAttention(nn.Module):
    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.attn_implementation = config.attn_implementation
        bias = config.attention_bias
        d, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, block, context, rope_q, rope_kv, mask=None, cache: DrafterCache | None = None):
        """block: (b, q, D); context: (b, c, D); rope_*: (cos, sin) of (b, len, head_dim)."""
        b, q_len, _ = block.shape
        kv_input = torch.cat([context, block], dim=1)
        kv_len = kv_input.shape[1]
        q = self.q_norm(self.q_proj(block).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_input).view(b, kv_len, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_input).view(b, kv_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, *rope_q)
        k = apply_rope(k, *rope_kv)
        if cache is not None:
            k, v = cache.append(self.layer_idx, k, v)
        out = attend(q, k, v, mask, self.attn_implementation)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class DrafterMLP(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DrafterAttention(config, layer_idx)
        self.mlp = DrafterMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # DFlash2's convolutions, set by `DFlashDrafter` after the DFlash weights are drawn.
        self.attention_conv: GroupedDynamicConv | None = None
        self.mlp_conv: GroupedDynamicConv | None = None

    def forward(self, hidden, context, rope_q, rope_kv, mask=None, cache=None, block_rows: int = 0):
        """`block_rows`: the rows of one block, which DFlash2's convolutions stay within."""
        x = self.input_layernorm(hidden)
        if self.attention_conv is None:
            hidden = hidden + self.self_attn(x, context, rope_q, rope_kv, mask, cache)
        else:
            x, coefficients = self.attention_conv.pre(x, block_rows)
            out = self.self_attn(x, context, rope_q, rope_kv, mask, cache)
            hidden = hidden + self.attention_conv.post(out, coefficients, block_rows)
        x = self.post_attention_layernorm(hidden)
        if self.mlp_conv is None:
            return hidden + self.mlp(x)
        x, coefficients = self.mlp_conv.pre(x, block_rows)
        return hidden + self.mlp_conv.post(self.mlp(x), coefficients, block_rows)


class DFlashDrafter(nn.Module):
    """The drafter network. Weight names follow the public DFlash layout."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.layers = nn.ModuleList(DrafterLayer(config, i) for i in range(config.num_hidden_layers))
        # Without target features (standalone-drafter ablation) the context is the prefix's
        # token embeddings, already of width D: no fusion layer.
        self.fc = nn.Linear(config.num_target_features * d, d, bias=False) if config.use_target_features else None
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary_emb = _build_rotary(config)
        self.apply(self._init_weights)
        # DSpark's heads (`dflash.drafter.heads`), only when configured: a DFlash drafter's
        # weights and their initialisation stay what they were. Applied by DSpark's objective
        # and proposer to the hidden states `forward` returns.
        self.markov_head, self.confidence_head = _dspark_heads(config)
        # DFlash2's convolutions (identity at first) and selector, drawn after the DFlash weights.
        self.candidate_selector = _add_dflash2_parts(self, config)
        self.draft_vocab: torch.Tensor | None = None
        """(K,) ascending token ids the drafter drafts over at decode, the vocabulary its training
        scored (`training.draft_vocab_size`; `dflash.drafter.io` keeps it beside the weights), or
        None: the whole vocabulary. Not a weight: readers of the directory never see it."""

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def add_dspark_heads(self, rank: int, confidence: bool) -> None:
        """Give this drafter new DSpark heads (a Markov head of `rank`, w2 zero, and a confidence
        head if `confidence`) on its weights' device and dtype; its config says so from now on."""
        self.config = dataclasses.replace(self.config, markov_rank=rank, confidence_head=confidence)
        like = self.norm.weight
        heads = [head.to(like.device, like.dtype) if head is not None else None for head in _dspark_heads(self.config)]
        self.markov_head, self.confidence_head = heads

    def add_dflash2_parts(self, kernel_size: int, group_size: int, rank: int, top_k: int) -> None:
        """Give this drafter new DFlash2 parts (identity convolutions, a selector with a zero
        successor codebook) on its weights' device and dtype; its config says so from now on
        (ConfigError naming the key where llama.cpp would refuse the draft)."""
        self.config = dataclasses.replace(
            self.config, conv_kernel_size=kernel_size, conv_group_size=group_size, selector_rank=rank, selector_top_k=top_k
        )
        self.candidate_selector = _add_dflash2_parts(self, self.config)
        like = self.norm.weight
        self.to(like.device, like.dtype)

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        context_features: torch.Tensor,
        context_positions: torch.Tensor,
        mask=None,
        cache: DrafterCache | None = None,
    ) -> torch.Tensor:
        """Hidden states of the block positions.

        Args:
            block_embeds: (b, q, D) target embeddings of the block tokens (anchor and masks;
                in training, many blocks concatenated).
            block_positions: (b, q) position ids, anchor_pos + k for slot k.
            context_features: (b, c, n_taps * D) concatenated target features of the new
                context positions (c may be 0); (b, c, D) token embeddings of those
                positions when `config.use_target_features` is False.
            context_positions: (b, c) their position ids.
            mask: None (decoding: every block query sees all keys, or, with a window or a
                causal block, those `decoding_mask` leaves) or a mask over (q, cache_len + c + q)
                keys, dense bool for sdpa or a flex BlockMask.
            cache: drafter KV cache holding earlier context; context and block keys are
                appended to it (crop the block off afterwards).
        Returns:
            (b, q, D) final-normed hidden states; logits = `TargetModel.logits(hidden)`.
        """
        dtype = self.norm.weight.dtype
        context = context_features.to(dtype)
        context = self.hidden_norm(self.fc(context) if self.fc is not None else context)
        hidden = block_embeds.to(dtype)
        rope_q = self.rotary_emb(hidden, block_positions)
        rope_kv = self.rotary_emb(hidden, torch.cat([context_positions, block_positions], dim=1))
        # decoding (a cache, or no mask) drafts one block; training's mask spans many
        block_rows = hidden.shape[1] if cache is not None or mask is None else self.config.block_size
        if mask is None and self.config.masked_decoding:
            mask = decoding_mask(self.config, 0 if cache is None else cache.length, context_positions, block_positions)
        for layer in self.layers:
            hidden = layer(hidden, context, rope_q, rope_kv, mask, cache, block_rows)
        return self.norm(hidden)


def decoding_mask(
    config: DrafterConfig, cached: int, context_positions: torch.Tensor, block_positions: torch.Tensor
) -> torch.Tensor:
    """(b, 1, q, cached + c + q) bool: which keys a decoding block sees under `config`'s window
    and causality. Keys: the cache's `cached` context positions [0, cached), the new context's
    and the block's positions; queries: the block's."""
    batch = block_positions.shape[0]
    cached_positions = torch.arange(cached, device=block_positions.device).expand(batch, cached)
    keys = torch.cat([cached_positions, context_positions, block_positions], dim=1)
    sees = sees_by_position(block_positions[:, :, None], keys[:, None, :], config.attention_window, config.block_causal)
    return sees.unsqueeze(1)


def _dspark_heads(config: DrafterConfig) -> tuple[MarkovHead | None, ConfidenceHead | None]:
    """New DSpark heads as `config` asks for them (None: not configured)."""
    rank = config.markov_rank
    markov = MarkovHead(config.vocab_size, rank) if rank else None
    return markov, ConfidenceHead(config.hidden_size, rank) if config.confidence_head else None


def _add_dflash2_parts(drafter: DFlashDrafter, config: DrafterConfig) -> CandidateSelector | None:
    """Give `drafter`'s layers DFlash2's convolutions and return its selector, as `config` asks
    (None: a DFlash or DSpark drafter)."""
    if not config.dflash2:
        return None
    d = config.hidden_size
    for layer in drafter.layers:
        layer.attention_conv = GroupedDynamicConv(d, config.conv_kernel_size, config.conv_group_size)
        layer.mlp_conv = GroupedDynamicConv(d, config.conv_kernel_size, config.conv_group_size)
    return CandidateSelector(d, config.vocab_size, config.selector_rank)


def _build_rotary(config: DrafterConfig) -> nn.Module:
    """Rotary embedding with the target's full-attention rope settings (llama3, yarn, linear,
    ... scaling included) over the whole head dim; see `DrafterConfig.rope_hf_config`."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(config.rope_hf_config())
