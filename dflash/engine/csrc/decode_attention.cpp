// softmax(q k^T * scale + mask) v for a few query positions over a KV cache (decoding),
// reading each kv head's keys and values from memory once for all the query heads of its
// group (GQA). Part of module.cpp (dflash.engine.kernels builds it); the engine
// calls it from its forward where it applies (`kernels.attention_plan`, `run_attention`).
//
// query: (B, H, Q, D); keys, values: (B, KVH, L, D), any strides with the last one 1 (the
// engine passes views of its static cache); mask: none, or bool (B, 1, Q, L), any strides
// (broadcast dimensions with stride 0), true = the key is seen. H % KVH == 0, query head h
// reads kv head h / (H / KVH), as SDPA's enable_gqa. All of query, keys, values float32
// or all bfloat16; the output (B, H, Q, D), laid out (B, Q, H, D), in that dtype.
//
// One task is one (batch row, kv head) and a part of its G * Q query rows (G = H / KVH):
// one part, unless there are few such pairs and the threads do not divide their count (a
// small model's 3 kv heads on 2 threads leave one thread idle a third of the time); then
// each pair's rows are cut in as many parts as threads. A row's result does not depend on
// the rows that share its task. Each row scores every key (float32 accumulation; bfloat16
// widened to float32, or with AVX512-BF16 pair products, exact, summed in float32), the
// scores of a row are scaled, masked (-inf), max-subtracted and exponentiated
// (vectorised Cephes-style exp, about 1 ulp), then the values are summed under those
// weights in float32 and divided by the row's sum once; bfloat16 rounds once (nearest
// even) at the end. A row whose keys are all masked gives 0, as SDPA's CPU flash kernel.
// Needs D in {64, 128, 256}; kernels.py checks it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "vec.h"

namespace {

using namespace dflash_vec;

// q . k * scale of `rows` query rows against keys [j0, j0 + n), n <= W, into
// scores[r * ld + j0 ...] (a block of W keys stays in L1 while the rows pass over it).
template <int NC, typename T>
inline void score_block(const T* k, int64_t k_stride, int n, const T* const* q, int rows, vf scale, float* scores,
                        int64_t ld, int64_t j0) {
  for (int r = 0; r < rows; ++r) {
    vf acc[W];
#if defined(DFLASH_BF16_DOT)
    if constexpr (sizeof(T) == 2) {
      constexpr int NP = NC / 2;  // 32 bfloat16 per vector
      __m512bh qv[NP];
      for (int c = 0; c < NP; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q[r] + 32 * c);
      for (int j = 0; j < W; ++j) {
        acc[j] = zero();
        if (j < n)
          for (int c = 0; c < NP; ++c)
            acc[j] = _mm512_dpbf16_ps(acc[j], qv[c], (__m512bh)_mm512_loadu_si512(k + j * k_stride + 32 * c));
      }
      store(scores + r * ld + j0, mul(lane_sums(acc), scale));
      continue;
    }
#endif
    vf qv[NC];
    for (int c = 0; c < NC; ++c) qv[c] = load(q[r] + W * c);
    for (int j = 0; j < W; ++j) {
      acc[j] = zero();
      if (j < n)
        for (int c = 0; c < NC; ++c) acc[j] = fmadd(qv[c], load(k + j * k_stride + W * c), acc[j]);
    }
    store(scores + r * ld + j0, mul(lane_sums(acc), scale));
  }
}

// out rows += sum over keys of p[r][j] v[j], for ROWS rows of weights (weights[r * ld + j]).
template <int NC, int ROWS, typename T>
inline void weigh_values(const T* v, int64_t v_stride, int64_t L, const float* weights, int64_t ld,
                         const float* inverse_sums, T* const* out) {
  vf acc[ROWS][NC];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = zero();
  for (int64_t j = 0; j < L; ++j) {
    const T* vj = v + j * v_stride;
    vf vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load(vj + W * c);
    for (int r = 0; r < ROWS; ++r) {
      const vf p = set1(weights[r * ld + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = fmadd(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    const vf inv = set1(inverse_sums[r]);
    for (int c = 0; c < NC; ++c) store(out[r] + W * c, mul(acc[r][c], inv));
  }
}

template <int NC, typename T>
void weigh_group(const T* v, int64_t v_stride, int64_t L, const float* weights, int64_t ld, const float* inverse_sums,
                 T* const* out, int rows) {
  constexpr int RG = std::max(1, std::min(6, (REGS - 2) / (NC + 1)));  // rows per pass: RG * NC accumulators
  for (int r0 = 0; r0 < rows; r0 += RG) {
    const int n = std::min(RG, rows - r0);
    const float* w = weights + r0 * ld;
    switch (n) {
#define DFLASH_ROWS(k)                                                                 \
  case k:                                                                              \
    if constexpr (k <= RG) weigh_values<NC, k>(v, v_stride, L, w, ld, inverse_sums + r0, out + r0); \
    break;
      DFLASH_ROWS(1)
      DFLASH_ROWS(2)
      DFLASH_ROWS(3)
      DFLASH_ROWS(4)
      DFLASH_ROWS(5)
      DFLASH_ROWS(6)
#undef DFLASH_ROWS
      default:
        break;
    }
  }
}

// scores s[j] = -inf for the keys j in [from, L) that the mask row m hides, 8 bools at a time
// (a run of seen keys, the common case, costs one compare)
inline void hide_masked(float* s, const bool* m, int64_t mask_l, int64_t from, int64_t L) {
  constexpr uint64_t all_seen = 0x0101010101010101ull;
  int64_t j = from;
  if (mask_l == 1) {
    for (; j + 8 <= L; j += 8) {
      uint64_t bits;
      std::memcpy(&bits, m + j, sizeof(bits));
      if (bits == all_seen) continue;
      for (int t = 0; t < 8; ++t)
        if (!m[j + t]) s[j + t] = -std::numeric_limits<float>::infinity();
    }
  }
  for (; j < L; ++j)
    if (!m[j * mask_l]) s[j] = -std::numeric_limits<float>::infinity();
}

struct Strides {
  int64_t b, h, l;
};

template <int NC, typename T>
void attend(const T* query, Strides qs, int64_t q_pos_stride, const T* keys, Strides ks, const T* values, Strides vs,
            const bool* mask, int64_t mask_b, int64_t mask_q, int64_t mask_l, T* out, int64_t B, int64_t H,
            int64_t KVH, int64_t Q, int64_t L, float scale) {
  constexpr int64_t D = W * NC;
  const int64_t G = H / KVH, R = G * Q;
  const int64_t ld = (L + W - 1) / W * W;
  const vf scale_v = set1(scale);
  const int64_t pairs = B * KVH, threads = at::get_num_threads();
  const int64_t parts = pairs % threads != 0 && pairs < 8 * threads ? std::min(threads, R) : 1;
  at::parallel_for(0, pairs * parts, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals flush;
    std::vector<float> scores(R * ld);
    std::vector<float> inverse_sums(R);
    std::vector<const T*> q_rows(R);
    std::vector<T*> out_rows(R);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / parts / KVH, kvh = task / parts % KVH, part = task % parts;
      // the pair's row r = g * Q + i: query head kvh * G + g at position i; this task's rows
      // are [r0, r0 + n), its own rows 0..n-1
      const int64_t r0 = part * R / parts, n = (part + 1) * R / parts - r0;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t g = (r0 + r) / Q, i = (r0 + r) % Q, h = kvh * G + g;
        q_rows[r] = query + b * qs.b + h * qs.h + i * q_pos_stride;
        out_rows[r] = out + ((b * Q + i) * H + h) * D;
      }
      // keys before the first one any row sees (a row's left padding) are skipped, from a
      // multiple of W on: the scores' lanes keep their keys, so the result is bit for bit
      // the one over every key (the skipped ones weigh exactly 0)
      int64_t j_lo = 0;
      if (mask) {
        j_lo = L;
        for (int64_t i = 0; i < Q; ++i) {
          const bool* m = mask + b * mask_b + i * mask_q;
          int64_t j = 0;
          while (j < j_lo && !m[j * mask_l]) ++j;
          j_lo = j;
        }
        j_lo = j_lo == L ? 0 : j_lo / W * W;
      }
      const T* k = keys + b * ks.b + kvh * ks.h;
      for (int64_t j0 = j_lo; j0 < L; j0 += W)
        score_block<NC>(k + j0 * ks.l, ks.l, static_cast<int>(std::min<int64_t>(W, L - j0)), q_rows.data(),
                        static_cast<int>(n), scale_v, scores.data(), ld, j0);
      for (int64_t r = 0; r < n; ++r) {
        float* s = scores.data() + r * ld;
        if (mask) hide_masked(s, mask + b * mask_b + (r0 + r) % Q * mask_q, mask_l, j_lo, L);
        for (int64_t j = L; j < ld; ++j) s[j] = -std::numeric_limits<float>::infinity();  // the last block's rest
        vf mx = set1(-std::numeric_limits<float>::infinity());
        for (int64_t j = j_lo; j < ld; j += W) mx = max(mx, load(s + j));
        const float top = reduce_max(mx);
        const vf topv = set1(top);
        vf sum = zero();
        for (int64_t j = j_lo; j < ld; j += W) {
          const vf e = exp_nonpositive(sub(load(s + j), topv));
          store(s + j, e);
          sum = add(sum, e);
        }
        // all keys masked: every weight is 0 and so is the row, as SDPA's CPU flash kernel
        inverse_sums[r] = top == -std::numeric_limits<float>::infinity() ? 0.0f : 1.0f / reduce_add(sum);
      }
      weigh_group<NC>(values + b * vs.b + kvh * vs.h + j_lo * vs.l, vs.l, L - j_lo, scores.data() + j_lo, ld,
                      inverse_sums.data(), out_rows.data(), static_cast<int>(n));
    }
  });
}

template <typename T>
void dispatch(int64_t D, const T* query, Strides qs, int64_t q_pos_stride, const T* keys, Strides ks, const T* values,
              Strides vs, const bool* mask, int64_t mb, int64_t mq, int64_t ml, T* out, int64_t B, int64_t H,
              int64_t KVH, int64_t Q, int64_t L, float scale) {
  switch (D) {
    case 64: attend<64 / W, T>(query, qs, q_pos_stride, keys, ks, values, vs, mask, mb, mq, ml, out, B, H, KVH, Q, L, scale); break;
    case 128: attend<128 / W, T>(query, qs, q_pos_stride, keys, ks, values, vs, mask, mb, mq, ml, out, B, H, KVH, Q, L, scale); break;
    case 256: attend<256 / W, T>(query, qs, q_pos_stride, keys, ks, values, vs, mask, mb, mq, ml, out, B, H, KVH, Q, L, scale); break;
    default: TORCH_CHECK(false, "decode_attention: head_dim 64, 128 or 256");
  }
}

}  // namespace

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                               const c10::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "decode_attention: 4-d query, keys, values");
  const int64_t B = query.size(0), H = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t KVH = keys.size(1), L = keys.size(2);
  TORCH_CHECK(keys.size(0) == B && values.size(0) == B && values.size(1) == KVH && values.size(2) == L &&
                  keys.size(3) == D && values.size(3) == D,
              "decode_attention: keys and values (B, KVH, L, D)");
  TORCH_CHECK(KVH > 0 && H % KVH == 0 && L > 0, "decode_attention: H % KVH == 0, L > 0");
  TORCH_CHECK(query.stride(3) == 1 && keys.stride(3) == 1 && values.stride(3) == 1, "decode_attention: head_dim stride 1");
  TORCH_CHECK(query.scalar_type() == keys.scalar_type() && keys.scalar_type() == values.scalar_type(),
              "decode_attention: one dtype");
  TORCH_CHECK(query.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(), "decode_attention: CPU");
  const bool* mask_data = nullptr;
  int64_t mb = 0, mq = 0, ml = 0;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 4 && mask->size(1) == 1, "decode_attention: bool mask (B, 1, Q, L)");
    TORCH_CHECK((mask->size(0) == B || mask->size(0) == 1) && (mask->size(2) == Q || mask->size(2) == 1) &&
                    mask->size(3) == L,
                "decode_attention: mask broadcast to (B, 1, Q, L)");
    mask_data = mask->data_ptr<bool>();
    mb = mask->size(0) == 1 ? 0 : mask->stride(0);
    mq = mask->size(2) == 1 ? 0 : mask->stride(2);
    ml = mask->stride(3);
  }
  // (B, Q, H, D) memory seen as (B, H, Q, D): the engine's transpose back is a view
  auto out = at::empty({B, Q, H, D}, query.options()).transpose(1, 2);
  const Strides qs{query.stride(0), query.stride(1), 0}, ks{keys.stride(0), keys.stride(1), keys.stride(2)},
      vs{values.stride(0), values.stride(1), values.stride(2)};
  const float s = static_cast<float>(scale);
  if (query.scalar_type() == at::kFloat) {
    dispatch<float>(D, query.data_ptr<float>(), qs, query.stride(2), keys.data_ptr<float>(), ks,
                    values.data_ptr<float>(), vs, mask_data, mb, mq, ml, out.data_ptr<float>(), B, H, KVH, Q, L, s);
  } else {
    TORCH_CHECK(query.scalar_type() == at::kBFloat16, "decode_attention: float32 or bfloat16");
    dispatch<bf16>(D, query.data_ptr<bf16>(), qs, query.stride(2), keys.data_ptr<bf16>(), ks, values.data_ptr<bf16>(),
                   vs, mask_data, mb, mq, ml, out.data_ptr<bf16>(), B, H, KVH, Q, L, s);
  }
  return out;
}
