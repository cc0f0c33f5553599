// The elementwise parts of a decoder layer, each one pass over its rows where PyTorch runs
// 4 to 9 ops (on 2 cores a one-token forward spent about a sixth of its time in them).
// dflash.target.kernels builds this file with small_gemm.cpp (one module); the engine calls
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
//   first index of the row's maximum, or of its first NaN (PyTorch's rule); torch's CPU
//   argmax compares one value at a time (docs/results/engine-2026-11-27d-xeon/).
// All other tensors float32 or all bfloat16, rows contiguous, widths multiples of 16 (D of 32);
// kernels.py checks it all.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <tuple>

#include "vec.h"

namespace {

using namespace dflash_vec;

// v rounded to T and back (bfloat16: nearest even; float32: v)
inline __m512 rounded(const float*, __m512 v) { return v; }

inline __m512 rounded(const at::BFloat16*, __m512 v) {
  const __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

template <typename T>
void rms_rows(const T* x, const T* delta, const T* weight, T* out, T* sum, int64_t rows, int64_t D, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * D;
      const T* h = xr;
      if (delta) {  // h = x + delta, rounded to T, kept for the caller
        T* s = sum + r * D;
        for (int64_t j = 0; j < D; j += 16) store(s + j, _mm512_add_ps(load_f32(xr + j), load_f32(delta + r * D + j)));
        h = s;
      }
      __m512 acc = _mm512_setzero_ps();
      for (int64_t j = 0; j < D; j += 16) {
        const __m512 v = load_f32(h + j);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
      }
      const float scale = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(D) + eps);
      const __m512 sv = _mm512_set1_ps(scale);
      for (int64_t j = 0; j < D; j += 16) {
        const __m512 normed = rounded(h, _mm512_mul_ps(load_f32(h + j), sv));
        store(out + r * D + j, _mm512_mul_ps(load_f32(weight + j), normed));
      }
    }
  });
}

// silu(g) = g / (1 + e^-g), as g * 1 / (1 + e) for g >= 0 and g * e / (1 + e) below, e = e^-|g|
inline __m512 silu(__m512 g) {
  const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 numerator = _mm512_mask_mov_ps(one, negative, e);
  return _mm512_mul_ps(g, _mm512_div_ps(numerator, _mm512_add_ps(one, e)));
}

template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * n;
      for (int64_t j = 0; j < n; j += 16) {
        const __m512 s = rounded(g, silu(load_f32(g + j)));
        store(out + r * n + j, _mm512_mul_ps(s, load_f32(g + n + j)));
      }
    }
  });
}

// x cos + roll(x, D/2) signed_sin for one head of D values, into out
template <typename T>
inline void rotate(const T* x, const T* cos, const T* sin, T* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t j = 0; j < D; j += 16) {
    const int64_t other = j < half ? j + half : j - half;
    const __m512 a = rounded(x, _mm512_mul_ps(load_f32(x + j), load_f32(cos + j)));
    store(out + j, _mm512_add_ps(a, _mm512_mul_ps(load_f32(x + other), load_f32(sin + j))));
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
        for (int64_t j = 0; j < D; j += 16) store(to + j, load_f32(v + j));
      }
    }
  });
}

// rms_rows' normalisation of one head into out (float32 sums, rounded where HF rounds)
template <typename T>
inline void norm_row(const T* x, const T* weight, float eps, T* out, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < D; j += 16) {
    const __m512 v = load_f32(x + j);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
  }
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(D) + eps));
  for (int64_t j = 0; j < D; j += 16)
    store(out + j, _mm512_mul_ps(load_f32(weight + j), rounded(x, _mm512_mul_ps(load_f32(x + j), scale))));
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

// the first index of x's maximum (of its first NaN if it has one), 16 lanes at a time
template <typename T>
int64_t argmax_row(const T* x, int64_t V) {
  const int64_t body = V - V % 16;
  __m512 best = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < body; j += 16) {
    const __m512 v = load_f32(x + j);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan) return j + __builtin_ctz(nan);
    best = _mm512_max_ps(best, v);
  }
  float top = _mm512_reduce_max_ps(best);
  for (int64_t j = body; j < V; ++j) {
    const float v = static_cast<float>(x[j]);
    if (std::isnan(v)) return j;
    top = v > top ? v : top;
  }
  const __m512 tops = _mm512_set1_ps(top);
  for (int64_t j = 0; j < body; j += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(load_f32(x + j), tops, _CMP_EQ_OQ);
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
    using bf = at::BFloat16;
    rms_rows<bf>(x.data_ptr<bf>(), has_delta ? delta->data_ptr<bf>() : nullptr, weight.data_ptr<bf>(), out.data_ptr<bf>(),
                 sum.data_ptr<bf>(), rows, D, e);
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
    using bf = at::BFloat16;
    silu_mul_rows<bf>(gate_up.data_ptr<bf>(), out.data_ptr<bf>(), rows, n);
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
    using bf = at::BFloat16;
    rope_rows<bf>(qkv.data_ptr<bf>(), cos.data_ptr<bf>(), signed_sin.data_ptr<bf>(), keys.data_ptr<bf>(),
                  values.data_ptr<bf>(), query.data_ptr<bf>(), B, Q, heads, kv_heads, D, start, keys.stride(0),
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
    using bf = at::BFloat16;
    norm_rope_rows<bf>(x.data_ptr<bf>(), has_weight ? weight->data_ptr<bf>() : nullptr, e, cos.data_ptr<bf>(),
                       signed_sin.data_ptr<bf>(), out.data_ptr<bf>(), B, S, H, D, x.stride(0), x.stride(1), x.stride(2));
  }
  return out;
}
