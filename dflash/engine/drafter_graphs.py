"""The drafter's propose as CUDA graphs, beside the target's (`target.engine: graphs`).

A propose runs the drafter once over c new context positions and a block of B: on a GPU
mostly host time, as is the target's forward (docs/design.md, "Measured figures").

Invariants:
- It computes what `DFlashDrafter.forward(..., mask=None, cache=...)` computes, through the
  module's own weights and PyTorch's ops (float32: within float rounding on CPU, run
  uncaptured; tests/engine/test_drafter_graphs.py).
- The cache is a `DrafterStaticCache`: the context's keys/values in preallocated buffers,
  `crop(length)` keeping the first `length` positions as `DrafterCache.crop` does. A
  propose writes its c + B positions at [length, length + c + B) by index and every block
  query attends over the whole capacity under the mask key < length + c + B (the context
  and its whole block), so one graph serves every length (`dflash.engine.graphs`).
- One graph per (batch, c, B) with c + B <= 2 MAX_GRAPH_WIDTH (c is the tokens the last
  step accepted, plus one); a longer context (the prompt, at the first propose) runs the
  same step uncaptured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash.engine.forward import StaticCache, apply_rope
from dflash.engine.graphs import MAX_GRAPH_WIDTH, StepGraphs, cache_buffers


class DrafterStaticCache(StaticCache):
    """A drafter's context keys/values in a `StaticCache`'s buffers, with `DrafterCache`'s
    crop: `crop(length)` keeps the first `length` positions."""

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


def static_propose(drafter: torch.nn.Module, block_embeds, block_positions, features, context_positions, start, keys, values):
    """`DFlashDrafter.forward` over a `DrafterStaticCache`'s buffers from position `start`
    (a 0-d device tensor) with no host reads; (b, B, D) final-normed hidden states."""
    config = drafter.config
    dtype = drafter.norm.weight.dtype
    context = features.to(dtype)
    context = drafter.hidden_norm(drafter.fc(context) if drafter.fc is not None else context)
    hidden = block_embeds.to(dtype)
    batch, q, _ = hidden.shape
    new = context.shape[1] + q
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    group = heads // kv_heads
    slots = start + torch.arange(new, device=hidden.device)
    # every block query sees the context before it and its whole block: keys [0, start + new)
    visible = (torch.arange(keys.shape[3], device=hidden.device) < start + new).repeat(group * q, 1)
    rope_q = drafter.rotary_emb(hidden, block_positions)
    rope_kv = drafter.rotary_emb(hidden, torch.cat([context_positions, block_positions], dim=1))
    for index, layer in enumerate(drafter.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        kv_input = torch.cat([context, x], dim=1)
        query = attn.q_norm(attn.q_proj(x).view(batch, q, heads, head_dim)).transpose(1, 2)
        key = attn.k_norm(attn.k_proj(kv_input).view(batch, new, kv_heads, head_dim)).transpose(1, 2)
        keys[index].index_copy_(2, slots, apply_rope(key, *rope_kv))
        values[index].index_copy_(2, slots, attn.v_proj(kv_input).view(batch, new, kv_heads, head_dim).transpose(1, 2))
        grouped = apply_rope(query, *rope_q).reshape(batch, kv_heads, group * q, head_dim)
        out = F.scaled_dot_product_attention(grouped, keys[index], values[index], attn_mask=visible)
        out = out.reshape(batch, heads, q, head_dim).transpose(1, 2).reshape(batch, q, heads * head_dim)
        hidden = hidden + attn.o_proj(out)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return drafter.norm(hidden)


class GraphedDrafter:
    """`DFlashDrafter.forward` for decoding with its proposes replayed from CUDA graphs
    (module invariants); called like the module, with a cache from `new_cache`."""

    def __init__(self, drafter: torch.nn.Module):  # a DFlashDrafter
        if drafter.config.ungraphable:  # its convolutions or its mask: the lean forward has both
            raise ValueError(
                "a DFlash2 drafter, or one with a window or a causal block, decodes on the lean or module forward: "
                "the graphed forward has no convolutions and no mask"
            )
        self.drafter = drafter
        self.steps = StepGraphs()

    def new_cache(self, batch: int = 1, capacity: int = 256) -> DrafterStaticCache:
        config, weight = self.drafter.config, self.drafter.norm.weight
        shape = (config.num_hidden_layers, batch, config.num_key_value_heads, config.head_dim)
        return DrafterStaticCache(*shape, weight.dtype, weight.device, capacity)

    @torch.inference_mode()
    def __call__(self, block_embeds, block_positions, context_features, context_positions, mask=None, cache=None):
        if mask is not None or not isinstance(cache, DrafterStaticCache):
            raise ValueError("the graphed drafter decodes: no mask, with a cache from its new_cache()")
        batch, q, _ = block_embeds.shape
        new = context_features.shape[1] + q
        cache.reserve(cache.length + new, batch)
        keys, values = cache.keys, cache.values
        inputs = (block_embeds, block_positions, context_features, context_positions)
        if new > 2 * MAX_GRAPH_WIDTH:  # the prompt's context: once per decode, uncaptured
            start = torch.tensor(cache.length, device=block_embeds.device)
            hidden = static_propose(self.drafter, *inputs, start, keys, values)
        else:

            def make_run(static, start):
                return lambda: static_propose(self.drafter, *static, start, keys, values)

            hidden = self.steps.step((batch, new - q, q), cache_buffers(cache), cache.length, inputs, make_run).clone()
        cache.length += new
        return hidden
