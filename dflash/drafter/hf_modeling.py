"""Self-contained modeling code shipped as `dflash.py` inside every drafter directory.

`config.json` names it in `auto_map` ({"AutoModel": "dflash.DFlashDraftModel"}, the
published DFlash layout), so other programs load a drafter with

    AutoModel.from_pretrained(directory, trust_remote_code=True)

and get the same network as `dflash.drafter.model.DFlashDrafter` (same weights, same
logits), with the interface of the public reference: `forward(position_ids,
noise_embedding, target_hidden, past_key_values, ...)`, the attributes `block_size`,
`mask_token_id`, `target_layer_ids`, and `spec_generate(target, input_ids, ...)`.

This file must import only torch and transformers and work under transformers 4.56+
and 5.x: it is copied verbatim and run without the dflash package installed. The
rotary embedding is the installed transformers' own (`LlamaRotaryEmbedding`), built
from the config, so config.json must carry rope settings that both generations read
(`dflash.target.rope_keys`).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


class DFlashRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (b, heads, seq, head_dim); cos/sin: (b, seq, head_dim)."""
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


class DFlashAttention(nn.Module):
    """Block queries attend to [context; block] keys: context keys come from the target
    features through this layer's own k/v projections (KV injection); no causal mask."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        bias = bool(getattr(config, "attention_bias", False))
        d, hd = config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=bias)
        self.q_norm = DFlashRMSNorm(hd, config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(hd, config.rms_norm_eps)

    def forward(self, hidden, context, rope_q, rope_kv, attention_mask=None, past_key_values=None):
        b, q_len, _ = hidden.shape
        kv_input = torch.cat([context, hidden], dim=1)
        kv_len = kv_input.shape[1]
        q = self.q_norm(self.q_proj(hidden).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_input).view(b, kv_len, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_input).view(b, kv_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = _apply_rope(q, *rope_q)
        k = _apply_rope(k, *rope_kv)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        if self.num_kv_heads != self.num_heads:
            k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
            v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class DFlashMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, context, rope_q, rope_kv, attention_mask=None, past_key_values=None):
        attn = self.self_attn(self.input_layernorm(hidden), context, rope_q, rope_kv, attention_mask, past_key_values)
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDraftModel(PreTrainedModel):
    """The DFlash drafter. It owns no embedding and no LM head: callers embed block
    tokens with the target's input embedding and read logits with the target's LM head."""

    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        dflash = dict(config.dflash_config)
        self.target_layer_ids = list(dflash.get("target_layer_ids") or [])
        self.mask_token_id = dflash.get("mask_token_id")
        self.block_size = dflash.get("block_size", getattr(config, "block_size", None))
        self.use_target_features = bool(dflash.get("use_target_features", True))
        d = config.hidden_size
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * d, d, bias=False) if self.use_target_features else None
        self.hidden_norm = DFlashRMSNorm(d, config.rms_norm_eps)
        self.norm = DFlashRMSNorm(d, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.post_init()

    def forward(
        self,
        position_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        noise_embedding: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        """Final-normed hidden states of the block; logits = target LM head of them.

        Args:
            position_ids: (b, c + q) positions of the new context and then the block
                (slot k of a block anchored at position p sits at p + k).
            noise_embedding: (b, q, D) target embeddings of the block tokens (anchor, masks).
            target_hidden: (b, c, n_taps * D) concatenated target features of the new
                context positions, in `target_layer_ids` order (hidden_states[i + 1]).
            attention_mask: None (every block query sees every key) or a bool/float mask
                broadcastable to (b, heads, q, cache + c + q).
            past_key_values: a transformers cache holding earlier context keys/values;
                this call appends context and block (crop the block off afterwards).
        Returns:
            (b, q, D).
        """
        dtype = self.norm.weight.dtype
        hidden = noise_embedding.to(dtype)
        context = target_hidden.to(dtype)
        context = self.hidden_norm(self.fc(context) if self.fc is not None else context)
        q_len = hidden.shape[1]
        rope_kv = self.rotary_emb(hidden, position_ids)
        rope_q = tuple(t[:, -q_len:] for t in rope_kv)
        for layer in self.layers:
            hidden = layer(hidden, context, rope_q, rope_kv, attention_mask, past_key_values)
        return self.norm(hidden)

    @torch.inference_mode()
    def spec_generate(
        self,
        target: nn.Module,
        input_ids: torch.LongTensor,
        max_new_tokens: int,
        stop_token_ids: list[int] | None = None,
        temperature: float = 0.0,
        block_size: int | None = None,
    ) -> torch.LongTensor:
        """Speculative decoding of one prompt (batch 1) with `target` verifying.

        Output equals the target decoding alone: greedy (temperature 0) token for token;
        with temperature > 0 a draft is kept only while it equals the target's own sample.
        Block tokens are embedded with the target's input embedding module, as the public
        reference does: for targets that scale embeddings inside their forward (Gemma2,
        Granite) drafts are worse than in dflash's own loop, the output is unchanged.
        Returns (1, prompt + new) token ids, cut after the first stop token.
        """
        self.eval()
        block_size = block_size or self.block_size
        embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        device, prompt_len = input_ids.device, input_ids.shape[1]
        target_cache, draft_cache = DynamicCache(), DynamicCache()
        cache_kwarg = _cache_argument(target)
        out = target(input_ids, **{cache_kwarg: target_cache}, use_cache=True, output_hidden_states=True)
        tokens = input_ids[0].tolist() + [int(_sample(out.logits[:, -1:], temperature))]
        context = self._features(out.hidden_states, embed, input_ids)
        stops = set(stop_token_ids or [])
        while len(tokens) - prompt_len < max_new_tokens and not stops & set(tokens[prompt_len:]):
            anchor_pos = len(tokens) - 1
            block = torch.full((1, block_size), self.mask_token_id, dtype=torch.long, device=device)
            block[0, 0] = tokens[-1]
            if block_size > 1:
                positions = torch.arange(draft_cache.get_seq_length(), anchor_pos + block_size, device=device)
                hidden = self(positions[None], noise_embedding=embed(block), target_hidden=context, past_key_values=draft_cache)
                _crop(draft_cache, anchor_pos)
                block[0, 1:] = lm_head(hidden[:, 1:]).argmax(-1)[0]
            positions = torch.arange(anchor_pos, anchor_pos + block_size, device=device)[None]
            out = target(block, position_ids=positions, **{cache_kwarg: target_cache}, use_cache=True, output_hidden_states=True)
            posterior = _sample(out.logits, temperature)
            matches = (block[0, 1:] == posterior[:-1]).int()
            accepted = int(matches.cumprod(0).sum())
            tokens += block[0, 1 : accepted + 1].tolist() + [int(posterior[accepted])]
            _crop(target_cache, anchor_pos + accepted + 1)
            context = self._features(out.hidden_states, embed, block)[:, : accepted + 1]
        new = tokens[prompt_len : prompt_len + max_new_tokens]
        cut = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
        return torch.tensor([tokens[:prompt_len] + new[:cut]], device=device)

    def _features(self, hidden_states, embed, ids) -> torch.Tensor:
        """Context for the new positions: tapped target layer outputs (or, for a drafter
        trained without target features, the tokens' embeddings)."""
        if not self.use_target_features:
            return embed(ids)
        return torch.cat([hidden_states[i + 1] for i in self.target_layer_ids], dim=-1)


def _crop(cache, length: int) -> None:
    """Keep the first `length` positions of a transformers cache. Crop by a negative
    count: transformers 5 accepts nothing else, transformers 4 accepts it too."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _sample(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(1, n, vocab) -> (n,) token ids: argmax, or a sample at `temperature`."""
    logits = logits[0].float()
    if temperature <= 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1)[:, 0]


def _cache_argument(model) -> str:
    """The name of the KV-cache argument: `cache` from transformers 5.24, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
