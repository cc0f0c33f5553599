"""Attention kernels for the drafter. All compute softmax(q k^T * scale) v with GQA.

- sdpa: `torch.nn.functional.scaled_dot_product_attention`, any device; `mask` is None
  (every query sees every key), a dense bool tensor (True = may attend) or, in CPU
  training, a `FactoredBlockMask`, computed explicitly.
- flex_attention: `torch.nn.attention.flex_attention`; `mask` is None or a `BlockMask`
  (training many blocks at once on CUDA; forward also runs on CPU).
- flash_attention_2: the `flash-attn` package (CUDA, fp16/bf16); unmasked only, i.e. the
  decoding path where one block sees its whole context.
A dense bool mask runs SDPA whatever the implementation: decoding with a window or a causal
block (`sees_by_position`) is the only decoding that has one.

The window and in-block causality are llama.cpp's rule over positions (src/llama-hparams.h:480-491,
`is_masked_swa`): a key at p0 is hidden from a query at p1 when p1 - p0 >= window, and, causal,
when p0 > p1. `sees_by_position` is that rule; training's block mask
(`dflash.training.masks.block_attention_rule`) and decoding's (`dflash.drafter.model`) both call it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash.errors import ConfigError


def sees_by_position(query_position, key_position, window: int | None, causal: bool) -> torch.Tensor:
    """May a query at `query_position` see a key at `key_position` (module docstring: llama.cpp's
    rule)? Elementwise over broadcastable integer tensors; all True with no window, not causal."""
    distance = query_position - key_position
    sees = distance < window if window is not None else torch.ones_like(distance, dtype=torch.bool)
    return sees & (distance >= 0) if causal else sees


@dataclass
class FactoredBlockMask:
    """The training block mask (`dflash.training.masks`) in factored form: the context
    part as a bool tensor, the block part as one (B, B) table every block shares (a query
    sees no key of another block). Under it `attend` scores each query against S + B keys
    instead of the dense mask's S + N*B (docs/design.md, "Measured figures").

    sees_context: (b, 1, N*B, S) bool, True = may attend to that context key.
    block_size: B.
    sees_block: (B, B) bool, query slot x key slot of its own block; None: all True (no window,
        not causal).
    """

    sees_context: torch.Tensor
    block_size: int
    sees_block: torch.Tensor | None = None


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask=None,
    implementation: str = "sdpa",
) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query heads.

    Args:
        q: (batch, heads, q_len, head_dim).
        k, v: (batch, kv_heads, kv_len, head_dim); heads % kv_heads == 0.
        mask: None, a bool tensor broadcastable to (batch, heads, q_len, kv_len), a
            `FactoredBlockMask` (sdpa), or a flex `BlockMask`.
        implementation: "sdpa", "flex_attention" or "flash_attention_2".
    Returns:
        (batch, heads, q_len, head_dim).
    """
    scale = q.shape[-1] ** -0.5
    if implementation == "sdpa" or isinstance(mask, torch.Tensor):
        if isinstance(mask, FactoredBlockMask):
            return _factored_block_attention(q, k, v, mask, scale)
        if mask is not None and not isinstance(mask, torch.Tensor):
            raise TypeError("sdpa takes a dense bool mask; build the mask with dense=True")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    if implementation == "flex_attention":
        return _flex(q, k, v, mask, scale)
    if implementation == "flash_attention_2":
        if mask is not None:  # training switches to training.attention's kernel (dflash.training.forward)
            raise ValueError("flash_attention_2 serves unmasked decoding only; train with flex_attention or sdpa")
        return _flash(q, k, v, scale)
    raise ValueError(f"unknown attention implementation {implementation!r}")  # DrafterSpec refuses it


def _factored_block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: FactoredBlockMask, scale: float
) -> torch.Tensor:
    """Attention of N blocks of B queries over S context keys (masked by `mask.sees_context`,
    (b, 1, N*B, S)) and their own block's B keys (masked by `mask.sees_block`), in one softmax.

    k, v hold the S context keys followed by the N*B block keys, as the drafter builds
    them; equal to SDPA under the dense mask of the same rule, without its (N*B)^2 part.
    """
    batch, heads, num_queries, head_dim = q.shape
    sees_context, block_size = mask.sees_context, mask.block_size
    seq_len, num_blocks = sees_context.shape[-1], num_queries // block_size
    if k.shape[1] != heads:  # grouped-query heads
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    q_blocks = q.view(batch, heads, num_blocks, block_size, head_dim)
    k_blocks = k[:, :, seq_len:].reshape(batch, heads, num_blocks, block_size, head_dim)
    v_blocks = v[:, :, seq_len:].reshape(batch, heads, num_blocks, block_size, head_dim)
    context_scores = (q @ k[:, :, :seq_len].transpose(-1, -2)) * scale
    context_scores = context_scores.masked_fill(~sees_context, float("-inf"))
    block_scores = q_blocks @ k_blocks.transpose(-1, -2)
    if mask.sees_block is not None:
        block_scores = block_scores.masked_fill(~mask.sees_block, float("-inf"))
    block_scores = block_scores.reshape(batch, heads, num_queries, block_size) * scale
    probs = torch.cat([context_scores, block_scores], dim=-1).float().softmax(dim=-1).to(q.dtype)
    context_out = probs[..., :seq_len] @ v[:, :, :seq_len]
    block_probs = probs[..., seq_len:].reshape(batch, heads, num_blocks, block_size, block_size)
    return context_out + (block_probs @ v_blocks).reshape(batch, heads, num_queries, head_dim)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def _flex(q, k, v, block_mask, scale):
    from torch.nn.attention.flex_attention import flex_attention

    # Uncompiled flex materialises the whole score matrix; on CUDA compile it into a
    # fused kernel. On CPU the eager version is only used for tests.
    kernel = _compiled_flex() if q.is_cuda else flex_attention
    return kernel(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _flash(q, k, v, scale):
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        raise ConfigError(
            "drafter.attn_implementation",
            "flash_attention_2 needs `pip install flash-attn` (not installed by dflash; the default sdpa needs nothing)",
        ) from None
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError("drafter.attn_implementation", "flash_attention_2 needs CUDA tensors in fp16/bf16")
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=False)
    return out.transpose(1, 2)
