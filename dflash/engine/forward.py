"""The fast target forward (`engine: fast`): a lean decoder forward over a static KV cache.

It replaces the HF forward with a `DynamicCache`, which on a 2-core CPU spends its time
outside the weights: per-layer Python and mask building, a `cat` of every layer's cache at
every step, separate q/k/v and gate/up matmuls, and MKL's float32 GEMM, which falls off at
a few rows on some CPUs (docs/design.md, "Measured figures").

Invariants:
- Same model. For the families it accepts (`fast_engine_refusal` is None: Llama, Mistral
  without a window, Qwen2, Qwen3 with SiLU MLPs and full attention) it computes what the
  HF forward computes, in the model's dtype, with the model's own rotary embedding: float32
  logits agree within float rounding (tests/engine/test_forward.py: 1e-4, greedy outputs
  identical). Anything else runs the HF forward, with one log line saying why.
- Cache layout. `StaticCache` holds keys/values of every layer in one preallocated buffer
  per kind (layers, batch, kv_heads, capacity, head_dim); positions [0, length) are
  valid. A forward writes its q new positions at [length, length + q) and advances
  `length`; `crop(-n)` only moves `length` back, so a rejected draft costs nothing to
  drop. `layers[i].keys` / `.values` are views of the whole capacity, so
  `dflash.target.cache.keep_cache_positions` (tree compaction) works unchanged.
- Taps. Feature tap of layer i is the output of decoder layer i, except the last layer,
  whose tap is the final-normed output, as HF's `hidden_states[-1]` (docs/design.md
  invariant 2).
- Kernels. Every weight matmul goes through `Linear`, which runs the kernel measured
  fastest here for its row count (`dflash.engine.kernels`); `kernel_path` records it.
- Attention. A CPU forward in float32 or bfloat16, with no mask or a boolean one (a
  prefill's causal mask, decoding, batched regeneration's key mask, draft verification),
  runs our kernel (`kernels.attention_plan`, `run_attention`): it reads each kv head's
  cached keys and values once for its group of query heads, straight from the cache's
  views, skips the blocks of keys a group of query rows does not see, and agrees with SDPA
  within float rounding (float32: 1e-6 relative; tests/engine/test_attention.py).
  Additive masks, CUDA and machines without our kernel run SDPA; `kernel_path` says which.
- Elementwise ops. On CPU in float32 or bfloat16 with our kernels built, RMSNorm (with the
  residual add before it), SiLU-and-multiply and the rotary embedding with the cache write
  (after Qwen3's norm of each head) run as our fused ops (`kernels.layer_ops`): one pass
  each where PyTorch runs 4 to 9 ops, rounding where PyTorch's ops round (equal within the
  last bit; tests/engine/test_layer_ops.py). Elsewhere, and for widths they do not take,
  PyTorch's ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash.engine.kernels import TUNED_ROWS, Linear, attention_available, attention_plan, layer_ops, run_attention, tune

_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def fast_engine_refusal(model) -> str | None:
    """Why the fast forward cannot run `model` exactly (None: it can)."""
    config = model.config
    if config.model_type not in _FAMILIES:
        return f"model_type {config.model_type!r} is not one of {', '.join(_FAMILIES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    if getattr(config, "mlp_bias", False):
        return "the MLP has biases"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    uses_window = getattr(config, "use_sliding_window", window is not None)
    if any(kind != "full_attention" for kind in layer_types) or (window is not None and uses_window):
        return "it has sliding-window layers"
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "rotary_emb") or not hasattr(base, "norm"):
        return "no model.rotary_emb / model.norm"
    return None


class StaticCache:
    """Preallocated keys/values of every layer (module invariants); grows (doubling, one
    copy) when a forward needs more than `capacity` positions."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, dtype, device, capacity: int = 256):
        self.length = 0
        shape = (num_layers, batch, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self._views()

    def _views(self) -> None:
        self.layers = [_LayerView(self.keys[i], self.values[i]) for i in range(self.keys.shape[0])]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, count: int) -> None:
        """Drop the last `-count` positions (count < 0), as `DynamicCache.crop` in transformers 5."""
        if count >= 0:
            raise ValueError(f"crop takes a negative count, got {count}")
        self.length = max(0, self.length + count)

    def row_view(self, start: int, stop: int, length: int) -> StaticCache:
        """Rows [start, stop) as a cache of their own holding `length` positions: views of this
        one's buffers, so a forward through it writes here (its `length` moves, not ours)."""
        view = StaticCache.__new__(StaticCache)
        view.keys, view.values, view.length = self.keys[:, start:stop], self.values[:, start:stop], length
        view._views()
        return view

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (a copy of their keys and values), in this order."""
        self.keys, self.values = self.keys.index_select(1, rows), self.values.index_select(1, rows)
        self._views()

    def reserve(self, needed: int, batch: int) -> None:
        """Make room for `needed` positions of `batch` rows in all; an empty cache takes the
        batch size of its first forward, as a DynamicCache does."""
        if batch != self.keys.shape[1]:
            if self.length:
                raise ValueError(f"the cache holds {self.keys.shape[1]} rows; a forward over {batch} rows cannot continue it")
            shape = (self.keys.shape[0], batch, *self.keys.shape[2:])
            self.keys, self.values = self.keys.new_zeros(shape), self.values.new_zeros(shape)
            self._views()
        if needed <= self.capacity:
            return
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:3], capacity, old.shape[4]))
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)
        self._views()


class _LayerView:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys = keys
        self.values = values


def _fuse(modules) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One (out, in) weight (and bias) for several linears applied to the same input; the
    modules' own parameters become views of it, so the model's memory does not double."""
    weight = torch.cat([m.weight.detach() for m in modules])
    bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
    row = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[row : row + rows], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[row : row + rows], requires_grad=False)
        row += rows
    return weight, bias


class _Layer:
    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = Linear(*_fuse([attn.q_proj, attn.k_proj, attn.v_proj]))
        self.o = Linear(attn.o_proj.weight, attn.o_proj.bias)
        self.gate_up = Linear(*_fuse([mlp.gate_proj, mlp.up_proj]))
        self.down = Linear(mlp.down_proj.weight, None)
        self.input_norm = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.post_norm = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.q_norm = None if q_norm is None else (q_norm.weight, q_norm.variance_epsilon)
        self.k_norm = None if k_norm is None else (k_norm.weight, k_norm.variance_epsilon)
        self.intermediate = mlp.gate_proj.weight.shape[0]


def rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """HF's RMSNorm op for op (normalise in float32, cast back, then scale by the weight), so
    the engine rounds as the model's own forward does in every dtype."""
    weight, eps = norm
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def add_rms_norm(ops, hidden: torch.Tensor, norm, delta: torch.Tensor | None = None):
    """(hidden + delta, its `rms_norm`), or without delta (hidden, its `rms_norm`): our fused op
    where `ops` (`kernels.layer_ops`) runs and the rows allow it, else PyTorch's ops."""
    weight = norm[0]
    rows_fit = hidden.shape[-1] % 16 == 0 and hidden.is_contiguous() and weight.dtype == hidden.dtype
    if ops is not None and rows_fit and (delta is None or (delta.is_contiguous() and delta.dtype == hidden.dtype)):
        normed, summed = ops.rms_norm(hidden, weight, norm[1], delta)
        return summed, normed
    if delta is not None:
        hidden = hidden + delta
    return hidden, rms_norm(hidden, norm)


def silu_mul(ops, gate_up: torch.Tensor, n: int) -> torch.Tensor:
    """silu(gate_up[..., :n]) * gate_up[..., n:], as `add_rms_norm` by our op or PyTorch's."""
    if ops is not None and n % 16 == 0 and gate_up.is_contiguous():
        return ops.silu_mul(gate_up, n)
    return F.silu(gate_up[..., :n]) * gate_up[..., n:]


def rope_tables(rotary, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed_sin) of an HF rotary module at `positions` (b, q), each (b, 1, q, d), for `rope`."""
    cos, sin = rotary(x, positions)
    half = sin.shape[-1] // 2
    return cos.unsqueeze(1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)


def rotary_fits(head_dim: int) -> bool:
    """Whether our fused rotary ops (`rope_into_cache`, `norm_rope`) take heads of this width."""
    return head_dim % 32 == 0 and head_dim <= 256


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotary of x (batch, heads, seq, head_dim); cos/sin: (batch, seq, head_dim)
    (the drafter module's, and its graphed propose's)."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = roll(x) * signed_sin."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class FastForward:
    """The lean forward of one HF model (`fast_engine_refusal(model)` must be None)."""

    def __init__(self, model):
        config = model.config
        base = model.model
        self.rotary = base.rotary_emb
        self.final_norm = (base.norm.weight, base.norm.variance_epsilon)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.dtype = base.norm.weight.dtype
        self.layers = [_Layer(layer) for layer in base.layers]
        self.embed_tokens = base.embed_tokens
        self.lm_head = Linear(model.lm_head.weight, model.lm_head.bias)
        # our fused rotary (kernels.layer_ops) applies to these heads (and Qwen3's norms of
        # them, kept in the rows' dtype); PyTorch's ops elsewhere
        q_norm = self.layers[0].q_norm
        same_dtype = q_norm is None or q_norm[0].dtype == self.embed_tokens.weight.dtype
        self.fused_rope = rotary_fits(self.head_dim) and same_dtype
        self.prepared = False
        self._draft_head: Linear | None = None

    def draft_head(self, rows: torch.Tensor | None = None) -> Linear:
        """A bfloat16 copy of the LM head for drafting (`TargetModel.draft_logits`), tuned on
        first use; with `rows` (K, D), of those rows of the head's weight (no bias) instead."""
        if rows is None and self._draft_head is not None:
            return self._draft_head
        bias = self.lm_head.bias if rows is None else None
        head = Linear((self.lm_head.weight if rows is None else rows).bfloat16(), None if bias is None else bias.bfloat16())
        tune([head], rows=TUNED_ROWS)
        if rows is None:
            self._draft_head = head
        return head

    def linears(self) -> list[Linear]:
        return [linear for layer in self.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [self.lm_head]

    def prepare(self) -> None:
        """Tune the kernels (once)."""
        if not self.prepared:
            tune(self.linears())
            self.prepared = True

    def new_cache(self, batch: int = 1, capacity: int = 256) -> StaticCache:
        device = self.final_norm[0].device
        return StaticCache(len(self.layers), batch, self.num_kv_heads, self.head_dim, self.dtype, device, capacity)

    def kernel_path(self) -> str:
        """The kernels chosen per row count for each projection (every layer chooses alike:
        one choice per weight shape) and for the head; whose attention and layer ops run."""
        if not self.prepared:
            return "untuned"
        layer = self.layers[0]
        projections = {"qkv": layer.qkv, "o": layer.o, "gate_up": layer.gate_up, "down": layer.down}
        layers = ", ".join(f"{name} {linear.describe()}" for name, linear in projections.items())
        path = f"{self.dtype}".removeprefix("torch.") + f"; layers {layers}; head {self.lm_head.describe()}"
        like = self.final_norm[0]
        path += "; attention ours" if attention_available(like) else "; attention sdpa"
        ops = layer_ops(like)
        return path + (f"; layer ops ours ({ops.isa})" if ops is not None else "; layer ops torch")

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: StaticCache,
        layer_ids: list[int] | None = None,
        logits_to_keep: int = 0,
        attention_mask: torch.Tensor | None = None,
    ):
        """(logits (b, kept, V) float32, features (b, q, taps * D) or None), as `TargetModel.forward`.

        attention_mask: None (causal over the cache and the new positions), or an additive
            or boolean (b or 1, 1, q, length + q) mask used as given (tree verification,
            padded batches).
        """
        batch, q = input_ids.shape
        start = cache.length
        end = start + q
        cache.reserve(end, batch)
        hidden = self.embed_tokens(input_ids)
        cos, sin = rope_tables(self.rotary, hidden, position_ids)
        # SDPA takes a prefill's causal mask as `is_causal` (its fast path); our kernel as a mask
        mask, causal = attention_mask, attention_mask is None and q > 1 and start == 0
        if mask is None and q > 1:
            keys = torch.arange(end, device=input_ids.device)
            mask = keys <= torch.arange(start, end, device=input_ids.device).unsqueeze(1)
        taps = set(layer_ids or ())
        last = len(self.layers) - 1
        features = []
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        ops = layer_ops(hidden)
        fused_rope = ops is not None and self.fused_rope and cos.dtype == hidden.dtype
        if fused_rope:
            cos_rows, sin_rows = (table[:, 0].expand(batch, q, head_dim).contiguous() for table in (cos, sin))
        for index, layer in enumerate(self.layers):
            hidden, x = add_rms_norm(ops, hidden, layer.input_norm)
            qkv = layer.qkv(x)
            if fused_rope and layer.q_norm is None:
                query = ops.rope_into_cache(qkv, cos_rows, sin_rows, cache.keys[index], cache.values[index], start, heads, kv_heads)
            elif fused_rope:  # Qwen3: the norm of each head, then the rotary, in one pass
                query = ops.norm_rope(qkv[..., :q_width].view(batch, q, heads, head_dim), *layer.q_norm, cos_rows, sin_rows)
                key = qkv[..., q_width : q_width + kv_width].view(batch, q, kv_heads, head_dim)
                cache.keys[index, :, :, start:end] = ops.norm_rope(key, *layer.k_norm, cos_rows, sin_rows)
                cache.values[index, :, :, start:end] = (
                    qkv[..., q_width + kv_width :].view(batch, q, kv_heads, head_dim).transpose(1, 2)
                )
            else:
                query, key, value = qkv_heads(self, layer, qkv, cos, sin)
                cache.keys[index, :, :, start:end] = key
                cache.values[index, :, :, start:end] = value
            keys, values = cache.keys[index, :, :, :end], cache.values[index, :, :, :end]
            if index == 0:  # every layer has the same shapes: check once per forward
                plan = attention_plan(query, keys, values, mask)
            out = None if plan is None else run_attention(query, keys, values, plan[0])
            if out is None:
                out = F.scaled_dot_product_attention(
                    query, keys, values, attn_mask=None if causal else mask, is_causal=causal, enable_gqa=heads != kv_heads
                )
            attended = layer.o(out.transpose(1, 2).reshape(batch, q, q_width))
            hidden, x = add_rms_norm(ops, hidden, layer.post_norm, attended)
            gate_up = layer.gate_up(x)
            hidden = hidden + layer.down(silu_mul(ops, gate_up, layer.intermediate))
            if index in taps and index != last:
                features.append(hidden)
        cache.length = end
        _, normed = add_rms_norm(ops, hidden, self.final_norm)
        if last in taps:
            features.append(normed)
        if logits_to_keep:
            normed = normed[:, -logits_to_keep:]
        logits = self.lm_head(normed).float()
        return logits, _ordered(features, layer_ids)


def qkv_heads(fast: FastForward, layer: _Layer, qkv: torch.Tensor, cos, sin):
    """(query, key, value), each (b, heads, q, head_dim), of one layer's fused projection
    (b, q, (heads + 2 kv_heads) head_dim): Qwen3's norm of each head, then the rotary, in
    PyTorch's ops."""
    batch, q = qkv.shape[:2]
    heads, kv_heads, head_dim = fast.num_heads, fast.num_kv_heads, fast.head_dim
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    query = qkv[..., :q_width].view(batch, q, heads, head_dim)
    key = qkv[..., q_width : q_width + kv_width].view(batch, q, kv_heads, head_dim)
    value = qkv[..., q_width + kv_width :].view(batch, q, kv_heads, head_dim)
    if layer.q_norm is not None:
        query, key = rms_norm(query, layer.q_norm), rms_norm(key, layer.k_norm)
    return rope(query.transpose(1, 2), cos, sin), rope(key.transpose(1, 2), cos, sin), value.transpose(1, 2)


def _ordered(features: list[torch.Tensor], layer_ids):
    """Tapped features concatenated in `layer_ids` order (collected in layer order)."""
    if not layer_ids:
        return None
    by_layer = dict(zip(sorted(set(layer_ids)), features))
    return torch.cat([by_layer[i] for i in layer_ids], dim=-1)
