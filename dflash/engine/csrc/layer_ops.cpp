// The elementwise parts of a decoder layer, each one pass over its rows where PyTorch runs
// 4 to 9 ops (on 2 cores a one-token forward spent about a sixth of its time in them).
// Part of module.cpp (dflash.engine.kernels builds it); the engine calls
// them where `kernels.layer_ops` allows. Each rounds where HF's ops round (to the tensor's
// dtype after every op that PyTorch runs separately), so they differ from PyTorch's ops in
// the last bit at most (summation order, our exp):
// - rms_norm(x, weight, eps, delta): h = x (+ delta); weight * (h / sqrt(mean(h^2) + eps)),
//   normalised in float32 and cast to the dtype before the weight, as HF's RMSNorm; with
//   delta, also returns h (the residual add fused in front).
// - silu_mul(gate_up, n): silu(gate_up[:, :n]) * gate_up[:, n:].
// - rope_into_cache(qkv, cos, signed_sin, keys, values, start, heads, kv_heads): splits
//   (B, Q, (H + 2 KVH) D) rows into query, key and value heads, rotates query and key
//   (x cos + roll(x, D/2) signed_sin, as engine.rope), writes keys and values at positions
//   [start, start + Q) of one layer's cache (B, KVH, capacity, D) and returns the query
//   (B, H, Q, D). cos, signed_sin: (B, Q, D).
// - norm_rope(x, weight, eps, cos, signed_sin): heads (B, S, H, D), rows of D contiguous,
//   each through HF's RMSNorm over D when weight is given (Qwen3's q_norm and k_norm, the
//   drafter's), then rotated as rope_into_cache does; returns (B, H, S, D).
// - argmax_rows(x): x.argmax(-1) of contiguous (..., V) rows as (rows,) int64, any V: the
//   first index of the row's maximum, or of its first NaN (PyTorch's rule), vectorised where
//   torch's CPU argmax compares one value at a time.
// All other tensors float32 or all bfloat16, rows contiguous, widths multiples of 16 (D of 32);
// kernels.py checks it all.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <tuple>

#include "vec.h"

namespace {

using namespace dflash_vec;

// v rounded to T and back (bfloat16: nearest even; float32: v)
inline vf rounded(const float*, vf v) { return v; }
inline vf rounded(const bf16*, vf v) { return round_bf16(v); }

template <typename T>
void rms_rows(const T* x, const T* delta, const T* weight, T* out, T* sum, int64_t rows, int64_t D, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * D;
      const T* h = xr;
      if (delta) {  // h = x + delta, rounded to T, kept for the caller
        T* s = sum + r * D;
        for (int64_t j = 0; j < D; j += W) store(s + j, add(load(xr + j), load(delta + r * D + j)));
        h = s;
      }
      vf acc = zero();
      for (int64_t j = 0; j < D; j += W) {
        const vf v = load(h + j);
        acc = add(acc, mul(v, v));
      }
      const vf scale = set1(1.0f / std::sqrt(reduce_add(acc) / static_cast<float>(D) + eps));
      for (int64_t j = 0; j < D; j += W) store(out + r * D + j, mul(load(weight + j), rounded(h, mul(load(h + j), scale))));
    }
  });
}

// silu(g) = g / (1 + e^-g), as g * 1 / (1 + e) for g >= 0 and g * e / (1 + e) below, e = e^-|g|
inline vf silu(vf g) {
  const vf e = exp_nonpositive(sub(zero(), abs(g)));
  const vf one = set1(1.0f);
  return mul(g, div(where_negative(g, e, one), add(one, e)));
}

template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * n;
      for (int64_t j = 0; j < n; j += W) store(out + r * n + j, mul(rounded(g, silu(load(g + j))), load(g + n + j)));
    }
  });
}

// x cos + roll(x, D/2) signed_sin for one head of D values, into out
template <typename T>
inline void rotate(const T* x, const T* cos, const T* sin, T* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t j = 0; j < D; j += W) {
    const int64_t other = j < half ? j + half : j - half;
    const vf a = rounded(x, mul(load(x + j), load(cos + j)));
    store(out + j, add(a, mul(load(x + other), load(sin + j))));
  }
}

template <typename T>
void rope_rows(const T* qkv, const T* cos, const T* sin, T* keys, T* values, T* query, int64_t B, int64_t Q, int64_t H,
               int64_t KVH, int64_t D, int64_t start, int64_t kb, int64_t kh, int64_t kl, int64_t vb, int64_t vh,
               int64_t vl) {
  const int64_t width = (H + 2 * KVH) * D;
  at::parallel_for(0, B * Q, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Q, i = task % Q;
      const T* row = qkv + task * width;
      const T* c = cos + task * D;
      const T* s = sin + task * D;
      for (int64_t h = 0; h < H; ++h) rotate(row + h * D, c, s, query + ((b * H + h) * Q + i) * D, D);
      for (int64_t h = 0; h < KVH; ++h) {
        rotate(row + (H + h) * D, c, s, keys + b * kb + h * kh + (start + i) * kl, D);
        const T* v = row + (H + KVH + h) * D;
        T* to = values + b * vb + h * vh + (start + i) * vl;
        for (int64_t j = 0; j < D; j += W) store(to + j, load(v + j));
      }
    }
  });
}

// rms_rows' normalisation of one head into out (float32 sums, rounded where HF rounds)
template <typename T>
inline void norm_row(const T* x, const T* weight, float eps, T* out, int64_t D) {
  vf acc = zero();
  for (int64_t j = 0; j < D; j += W) {
    const vf v = load(x + j);
    acc = add(acc, mul(v, v));
  }
  const vf scale = set1(1.0f / std::sqrt(reduce_add(acc) / static_cast<float>(D) + eps));
  for (int64_t j = 0; j < D; j += W) store(out + j, mul(load(weight + j), rounded(x, mul(load(x + j), scale))));
}

template <typename T>
void norm_rope_rows(const T* x, const T* weight, float eps, const T* cos, const T* sin, T* out, int64_t B, int64_t S,
                    int64_t H, int64_t D, int64_t sb, int64_t ss, int64_t sh) {
  at::parallel_for(0, B * S, 1, [&](int64_t begin, int64_t end) {
    T normed[256];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / S, i = task % S;
      for (int64_t h = 0; h < H; ++h) {
        const T* head = x + b * sb + i * ss + h * sh;
        if (weight) {
          norm_row(head, weight, eps, normed, D);
          head = normed;
        }
        rotate(head, cos + task * D, sin + task * D, out + ((b * H + h) * S + i) * D, D);
      }
    }
  });
}

// the first index of x's maximum (of its first NaN if it has one), W lanes at a time
template <typename T>
int64_t argmax_row(const T* x, int64_t V) {
  const int64_t body = V - V % W;
  vf best = set1(-INFINITY);
  for (int64_t j = 0; j < body; j += W) {
    const vf v = load(x + j);
    const unsigned nan = nan_lanes(v);
    if (nan) return j + __builtin_ctz(nan);
    best = max(best, v);
  }
  float top = reduce_max(best);
  for (int64_t j = body; j < V; ++j) {
    const float v = static_cast<float>(x[j]);
    if (std::isnan(v)) return j;
    top = v > top ? v : top;
  }
  const vf tops = set1(top);
  for (int64_t j = 0; j < body; j += W) {
    const unsigned hit = equal_lanes(load(x + j), tops);
    if (hit) return j + __builtin_ctz(hit);
  }
  for (int64_t j = body; j < V; ++j)
    if (static_cast<float>(x[j]) == top) return j;
  return 0;  // every value -inf
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16),
              "layer_ops: ", name, " must be a float32 or bfloat16 CPU tensor");
  TORCH_CHECK(t.is_contiguous() && t.size(-1) % 16 == 0, "layer_ops: ", name, " must be contiguous, width % 16 == 0");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                            const c10::optional<at::Tensor>& delta) {
  check_rows(x, "x");
  check_rows(weight, "weight");
  const int64_t D = x.size(-1), rows = x.numel() / D;
  TORCH_CHECK(weight.numel() == D && weight.scalar_type() == x.scalar_type(), "layer_ops: weight (D,) in x's dtype");
  const bool has_delta = delta.has_value() && delta->defined();
  if (has_delta) {
    check_rows(*delta, "delta");
    TORCH_CHECK(delta->sizes() == x.sizes() && delta->scalar_type() == x.scalar_type(), "layer_ops: delta like x");
  }
  auto out = at::empty_like(x);
  auto sum = has_delta ? at::empty_like(x) : x;
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    rms_rows<float>(x.data_ptr<float>(), has_delta ? delta->data_ptr<float>() : nullptr, weight.data_ptr<float>(),
                    out.data_ptr<float>(), sum.data_ptr<float>(), rows, D, e);
  } else {
        rms_rows<bf16>(x.data_ptr<bf16>(), has_delta ? delta->data_ptr<bf16>() : nullptr, weight.data_ptr<bf16>(), out.data_ptr<bf16>(),
                 sum.data_ptr<bf16>(), rows, D, e);
  }
  return {out, sum};
}

at::Tensor silu_mul(const at::Tensor& gate_up, int64_t n) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(-1) == 2 * n && n % 16 == 0, "layer_ops: gate_up (..., 2n), n % 16 == 0");
  auto sizes = gate_up.sizes().vec();
  sizes.back() = n;
  auto out = at::empty(sizes, gate_up.options());
  const int64_t rows = gate_up.numel() / (2 * n);
  if (gate_up.scalar_type() == at::kFloat) {
    silu_mul_rows<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), rows, n);
  } else {
        silu_mul_rows<bf16>(gate_up.data_ptr<bf16>(), out.data_ptr<bf16>(), rows, n);
  }
  return out;
}

at::Tensor rope_into_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin, at::Tensor keys,
                           at::Tensor values, int64_t start, int64_t heads, int64_t kv_heads) {
  check_rows(qkv, "qkv");
  check_rows(cos, "cos");
  check_rows(signed_sin, "signed_sin");
  TORCH_CHECK(qkv.dim() == 3 && keys.dim() == 4 && values.dim() == 4, "layer_ops: qkv (B, Q, W), keys/values (B, KVH, L, D)");
  const int64_t B = qkv.size(0), Q = qkv.size(1), D = keys.size(3);
  TORCH_CHECK(D % 32 == 0 && qkv.size(2) == (heads + 2 * kv_heads) * D, "layer_ops: qkv width (H + 2 KVH) D, D % 32 == 0");
  TORCH_CHECK(cos.numel() == B * Q * D && signed_sin.numel() == B * Q * D, "layer_ops: cos, signed_sin (B, Q, D)");
  TORCH_CHECK(keys.size(0) == B && keys.size(1) == kv_heads && values.sizes() == keys.sizes() &&
                  start + Q <= keys.size(2) && keys.stride(3) == 1 && values.stride(3) == 1,
              "layer_ops: keys, values (B, KVH, L >= start + Q, D), rows contiguous");
  const auto dtype = qkv.scalar_type();
  TORCH_CHECK(cos.scalar_type() == dtype && signed_sin.scalar_type() == dtype && keys.scalar_type() == dtype &&
                  values.scalar_type() == dtype,
              "layer_ops: one dtype");
  auto query = at::empty({B, heads, Q, D}, qkv.options());
  if (dtype == at::kFloat) {
    rope_rows<float>(qkv.data_ptr<float>(), cos.data_ptr<float>(), signed_sin.data_ptr<float>(), keys.data_ptr<float>(),
                     values.data_ptr<float>(), query.data_ptr<float>(), B, Q, heads, kv_heads, D, start, keys.stride(0),
                     keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2));
  } else {
        rope_rows<bf16>(qkv.data_ptr<bf16>(), cos.data_ptr<bf16>(), signed_sin.data_ptr<bf16>(), keys.data_ptr<bf16>(),
                  values.data_ptr<bf16>(), query.data_ptr<bf16>(), B, Q, heads, kv_heads, D, start, keys.stride(0),
                  keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2));
  }
  return query;
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.is_contiguous() && x.dim() >= 1 && x.size(-1) > 0,
              "layer_ops: argmax_rows of contiguous float32 or bfloat16 CPU rows");
  const int64_t V = x.size(-1), rows = x.numel() / V;
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* index = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      index[r] = x.scalar_type() == at::kFloat ? argmax_row(x.data_ptr<float>() + r * V, V)
                                               : argmax_row(x.data_ptr<at::BFloat16>() + r * V, V);
    }
  });
  return out;
}

at::Tensor norm_rope(const at::Tensor& x, const c10::optional<at::Tensor>& weight, double eps, const at::Tensor& cos,
                     const at::Tensor& signed_sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 4 && x.stride(3) == 1, "layer_ops: norm_rope of (B, S, H, D) CPU heads");
  check_rows(cos, "cos");
  check_rows(signed_sin, "signed_sin");
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3);
  TORCH_CHECK(D % 32 == 0 && D <= 256 && cos.numel() == B * S * D && signed_sin.numel() == B * S * D,
              "layer_ops: norm_rope: D % 32 == 0, D <= 256, cos and signed_sin (B, S, D)");
  const auto dtype = x.scalar_type();
  const bool has_weight = weight.has_value() && weight->defined();
  TORCH_CHECK(cos.scalar_type() == dtype && signed_sin.scalar_type() == dtype &&
                  (!has_weight || (weight->scalar_type() == dtype && weight->is_contiguous() && weight->numel() == D)),
              "layer_ops: norm_rope: one dtype, weight (D,)");
  auto out = at::empty({B, H, S, D}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const float e = static_cast<float>(eps);
  if (dtype == at::kFloat) {
    norm_rope_rows<float>(x.data_ptr<float>(), has_weight ? weight->data_ptr<float>() : nullptr, e, cos.data_ptr<float>(),
                          signed_sin.data_ptr<float>(), out.data_ptr<float>(), B, S, H, D, x.stride(0), x.stride(1),
                          x.stride(2));
  } else {
    TORCH_CHECK(dtype == at::kBFloat16, "layer_ops: norm_rope of float32 or bfloat16");
        norm_rope_rows<bf16>(x.data_ptr<bf16>(), has_weight ? weight->data_ptr<bf16>() : nullptr, e, cos.data_ptr<bf16>(),
                       signed_sin.data_ptr<bf16>(), out.data_ptr<bf16>(), B, S, H, D, x.stride(0), x.stride(1), x.stride(2));
  }
  return out;
}
