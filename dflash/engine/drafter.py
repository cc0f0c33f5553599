"""The drafter's lean decoding forward: `DFlashDrafter.forward` over a `DrafterCache` without
a mask, on the fast engine's kernels (`dflash.engine.kernels`), in bfloat16.

A propose reads the drafter's weights for 3-6 rows, where the module's float32 GEMMs and a
few dozen small ops per layer dominate. Here the projections are fused (k with v, gate with
up), run on the kernels tuned for this machine and read in bfloat16, half the bytes; norms,
MLP activation and each head's q/k norm with its rotary run as our fused layer ops
(`kernels.layer_ops`; docs/design.md, "Measured figures").

Invariants:
- It computes what `DFlashDrafter.forward(..., mask, cache=...)` computes, op for op in the
  same order (float32: equal within float rounding; tests/engine/test_drafter.py), with
  DFlash2's convolutions through copies of the module's (`GroupedDynamicConv`) and the
  boolean decoding mask its caller passes for a window or a causal block (None: none).
- `lean_linears`: a copy of any drafting module (DSpark's Markov head, an EAGLE-3 drafter)
  whose every `nn.Linear` runs on the tuned kernels, its weight copied to the lean dtype, its
  input and output in the module's own dtype (the rest of the module runs as it is, on the
  module's own parameters).
- Drafts only propose: the target's verify decides every emitted token (docs/design.md
  invariant 12), so bfloat16 rounding here can change which tokens are drafted, never the
  output.
- A snapshot: the weights are copied when it is built, so it is built only where they no
  longer change (a proposer for one evaluation).
- The graphed forward (`drafter_graphs`) has neither convolutions nor a mask: it refuses such
  a drafter and its proposer decodes here or on the module's forward.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from dflash.engine.forward import add_rms_norm, rms_norm, rope, rope_tables, rotary_fits, silu_mul
from dflash.engine.kernels import Linear, attention_plan, layer_ops, run_attention, tune


def _linear(dtype: torch.dtype, *modules) -> Linear:
    """One kernel linear of `modules` stacked along their outputs (k with v, gate with up)."""
    weight = torch.cat([m.weight.detach() for m in modules]).to(dtype)
    biases = [m.bias for m in modules]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases]).to(dtype)
    return Linear(weight, bias)


class _KernelLinear(torch.nn.Module):
    """An `nn.Linear`'s forward on `kernel` (a tuned `Linear` of its weight in another dtype)."""

    def __init__(self, kernel: Linear):
        super().__init__()
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x.to(self.kernel.weight.dtype)).to(x.dtype)


def lean_linears(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `module` for decoding whose every `nn.Linear` runs on the tuned kernels in `dtype`
    (module invariants): its modules are copied, its parameters and buffers shared (the linears'
    weights only read to make their kernels' copies); `module` itself is left as it is."""
    shared = {id(tensor): tensor for tensor in (*module.parameters(), *module.buffers())}
    lean = copy.deepcopy(module, shared).eval()
    kernels = []
    for parent in list(lean.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                kernels.append(_linear(dtype, child))
                setattr(parent, name, _KernelLinear(kernels[-1]))
    tune(kernels)
    return lean


def _norm(module, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    return module.weight.detach().to(dtype), module.eps


def _conv(conv, dtype: torch.dtype):
    """A copy of a DFlash2 `GroupedDynamicConv` in `dtype` (None: no convolution)."""
    return None if conv is None else copy.deepcopy(conv).to(dtype)


class FastDrafter:
    """`DFlashDrafter.forward` for decoding (module invariants); called like the module."""

    def __init__(self, drafter: torch.nn.Module, dtype: torch.dtype):  # a DFlashDrafter
        self.config = drafter.config
        self.dtype = dtype
        self.rotary = drafter.rotary_emb
        self.fc = None if drafter.fc is None else _linear(dtype, drafter.fc)
        self.hidden_norm, self.norm = _norm(drafter.hidden_norm, dtype), _norm(drafter.norm, dtype)
        self.layers = []
        for layer in drafter.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                {
                    "input_norm": _norm(layer.input_layernorm, dtype),
                    "q": _linear(dtype, attn.q_proj),
                    "kv": _linear(dtype, attn.k_proj, attn.v_proj),
                    "q_norm": _norm(attn.q_norm, dtype),
                    "k_norm": _norm(attn.k_norm, dtype),
                    "o": _linear(dtype, attn.o_proj),
                    "post_norm": _norm(layer.post_attention_layernorm, dtype),
                    "gate_up": _linear(dtype, mlp.gate_proj, mlp.up_proj),
                    "down": _linear(dtype, mlp.down_proj),
                    "attention_conv": _conv(layer.attention_conv, dtype),
                    "mlp_conv": _conv(layer.mlp_conv, dtype),
                }
            )
        linears = [layer[name] for layer in self.layers for name in ("q", "kv", "o", "gate_up", "down")]
        tune(linears + ([self.fc] if self.fc is not None else []))
        first = drafter.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = first.num_heads, first.num_kv_heads, first.head_dim
        self.intermediate = drafter.layers[0].mlp.gate_proj.out_features

    @torch.inference_mode()
    def __call__(self, block_embeds, block_positions, context_features, context_positions, mask=None, cache=None):
        if cache is None:
            raise ValueError("the lean drafter forward decodes: with a DrafterCache")
        batch, q, _ = block_embeds.shape
        context = context_features.to(self.dtype)
        ops = layer_ops(context)
        context = add_rms_norm(ops, self.fc(context) if self.fc is not None else context, self.hidden_norm)[1]
        hidden = block_embeds.to(self.dtype)
        new = context.shape[1]
        cos, sin = rope_tables(self.rotary, hidden, torch.cat([context_positions, block_positions], dim=1))
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        fused = ops is not None and rotary_fits(head_dim) and cos.dtype == hidden.dtype
        if fused:  # our norm and rotary of each head in one pass (kernels.layer_ops)
            cos_rows, sin_rows = cos[:, 0].contiguous(), sin[:, 0].contiguous()
        for index, layer in enumerate(self.layers):
            hidden, x = add_rms_norm(ops, hidden, layer["input_norm"])
            if (conv := layer["attention_conv"]) is not None:
                x, coefficients = conv.pre(x, q)
            query = layer["q"](x).view(batch, q, heads, head_dim)
            kv = layer["kv"](torch.cat([context, x], dim=1))
            key = kv[..., : kv_heads * head_dim].view(batch, new + q, kv_heads, head_dim)
            value = kv[..., kv_heads * head_dim :].view(batch, new + q, kv_heads, head_dim).transpose(1, 2)
            if fused:
                query = ops.norm_rope(query, *layer["q_norm"], cos_rows[:, new:], sin_rows[:, new:])
                key = ops.norm_rope(key, *layer["k_norm"], cos_rows, sin_rows)
            else:
                query = rope(rms_norm(query, layer["q_norm"]).transpose(1, 2), cos[:, :, new:], sin[:, :, new:])
                key = rope(rms_norm(key, layer["k_norm"]).transpose(1, 2), cos, sin)
            keys, values = cache.append(index, key, value)
            if index == 0:  # every layer has the same shapes: check once per forward
                plan = attention_plan(query, keys, values, mask)
            out = None if plan is None else run_attention(query, keys, values, plan[0])
            if out is None:
                out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=heads != kv_heads)
            attended = layer["o"](out.transpose(1, 2).reshape(batch, q, heads * head_dim))
            if conv is not None:
                attended = conv.post(attended, coefficients, q)
            hidden, x = add_rms_norm(ops, hidden, layer["post_norm"], attended)
            if (conv := layer["mlp_conv"]) is not None:
                x, coefficients = conv.pre(x, q)
            out = layer["down"](silu_mul(ops, layer["gate_up"](x), self.intermediate))
            hidden = hidden + (out if conv is None else conv.post(out, coefficients, q))
        return add_rms_norm(ops, hidden, self.norm)[1]
