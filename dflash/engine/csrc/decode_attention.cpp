// softmax(q k^T * scale + mask) v for query positions over a KV cache (prefill, decoding,
// verification), reading each kv head's keys and values from memory once for all the query
// heads of its group (GQA). Part of module.cpp (dflash.engine.kernels builds it); the engine
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
// the rows that share its task. A task runs its rows in groups that fit the registers, each
// group in one pass over the keys it can see (from the chunk of the first key any row of
// the task sees to that of the last any row of the group sees: a causal prefill skips the
// later positions' keys), CH keys at a time (flash decoding: keys and values are read
// together, as two streams). With batched rows a task also fetches the next task's keys
// and values into cache: each is a few KB, too short for the hardware prefetcher, and read
// cold they took three times their bytes' time. A row scores every key (float32
// accumulation; bfloat16 widened to float32, or with AVX512-BF16 pair products, exact,
// summed in float32), scaled and masked (-inf); it keeps a running maximum and sum, and
// when a chunk raises the maximum its sum and weighted values so far are scaled by
// e^(old - new) (vectorised Cephes-style exp, about 1 ulp); the values are summed in
// float32 and divided by the row's sum once; bfloat16 rounds once (nearest even) at the
// end. Chunks start at multiples of CH from key 0 whatever the keys skipped, so a row's
// result is a function of its own query, keys and mask: a verified position gives the
// bits it gives decoded alone. A row whose keys are all masked gives 0, as SDPA's CPU
// flash kernel.
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

// q . k * scale of `rows` query rows against the n <= W keys at k, into scores[r * ld ...]
// (a block of W keys stays in L1 while the rows pass over it).
template <int NC, typename T>
inline void score_block(const T* k, int64_t k_stride, int n, const T* const* q, int rows, vf scale, float* scores,
                        int ld) {
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
      store(scores + r * ld, mul(lane_sums(acc), scale));
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
    store(scores + r * ld, mul(lane_sums(acc), scale));
  }
}

// A chunk's scores of one row: -inf for lanes [n, to) and the keys the mask row m hides, 8
// bools at a time (a run of seen keys, the common case, costs one compare).
inline void hide_masked(float* s, const bool* m, int64_t mask_l, int n, int to) {
  constexpr uint64_t all_seen = 0x0101010101010101ull;
  for (int j = n; j < to; ++j) s[j] = -std::numeric_limits<float>::infinity();
  if (!m) return;
  int j = 0;
  if (mask_l == 1) {
    for (; j + 8 <= n; j += 8) {
      uint64_t bits;
      std::memcpy(&bits, m + j, sizeof(bits));
      if (bits == all_seen) continue;
      for (int t = 0; t < 8; ++t)
        if (!m[j + t]) s[j + t] = -std::numeric_limits<float>::infinity();
    }
  }
  for (; j < n; ++j)
    if (!m[j * mask_l]) s[j] = -std::numeric_limits<float>::infinity();
}

// Rows [0, count) of a cache block (row j at base + j * stride, `bytes` each) fetched into
// cache one row per `fetch` (the next task's keys or values). Null base: nothing.
struct Rows {
  const char* base = nullptr;
  int64_t stride = 0, count = 0;
  int bytes = 0;
  inline void fetch(int64_t j) const {
    if (base == nullptr || j >= count) return;
    const char* row = base + j * stride;
    for (int line = 0; line < bytes; line += 64) prefetch_l2(row + line);
  }
};

// keys per chunk of attend_rows' pass: its scores' maximum and exponentials are taken per
// chunk, so their horizontal steps and the running maximum's checks are paid once per CH keys
constexpr int CH = 4 * W;

// One pass over keys [j_lo, j_hi) for ROWS query rows (flash decoding), CH keys at a time:
// each row's scores, its running maximum and sum (the earlier sums and weighted values
// scaled by e^(old max - new max) when the maximum grows), and the chunk's values weighted
// into the row's float32 accumulators. Keys and values are read together, chunk by chunk,
// as two streams. Chunks start at multiples of CH from key 0, and a chunk a row sees none
// of changes nothing of that row, so skipping whole masked chunks gives the same bits.
template <int NC, int ROWS, typename T>
inline void attend_rows(const T* k, int64_t k_stride, const T* v, int64_t v_stride, int64_t j_lo, int64_t j_hi,
                        const T* const* q, const bool* const* mask_rows, int64_t mask_l, vf scale, T* const* out,
                        const Rows& next_keys, const Rows& next_values) {
  alignas(64) float s[ROWS * CH];
  vf acc[ROWS][NC], sums[ROWS];
  float top[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < NC; ++c) acc[r][c] = zero();
    sums[r] = zero();
    top[r] = -std::numeric_limits<float>::infinity();
  }
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += CH) {
    const int n = static_cast<int>(std::min<int64_t>(CH, j_hi - j0)), blocks = (n + W - 1) / W;
    for (int j = 0; j < n; ++j) next_keys.fetch(j0 + j), next_values.fetch(j0 + j);
    for (int b = 0; b < blocks; ++b)
      score_block<NC>(k + (j0 + b * W) * k_stride, k_stride, std::min(W, n - b * W), q, ROWS, scale, s + b * W, CH);
    for (int r = 0; r < ROWS; ++r) {
      float* sr = s + r * CH;
      hide_masked(sr, mask_rows[r] ? mask_rows[r] + j0 * mask_l : nullptr, mask_l, n, blocks * W);
      vf mx = load(sr);
      for (int b = 1; b < blocks; ++b) mx = max(mx, load(sr + b * W));
      const float chunk_top = reduce_max(mx);
      if (chunk_top == -std::numeric_limits<float>::infinity()) {  // weights of exactly 0
        for (int b = 0; b < blocks; ++b) store(sr + b * W, zero());
        continue;
      }
      if (chunk_top > top[r]) {
        const vf shrink = exp_nonpositive(set1(top[r] - chunk_top));  // 0 for the first chunk seen
        for (int c = 0; c < NC; ++c) acc[r][c] = mul(acc[r][c], shrink);
        sums[r] = mul(sums[r], shrink);
        top[r] = chunk_top;
      }
      const vf topv = set1(top[r]);
      for (int b = 0; b < blocks; ++b) {
        const vf e = exp_nonpositive(sub(load(sr + b * W), topv));
        store(sr + b * W, e);
        sums[r] = add(sums[r], e);
      }
    }
    for (int j = 0; j < n; ++j) {
      const T* vj = v + (j0 + j) * v_stride;
      vf vv[NC];
      for (int c = 0; c < NC; ++c) vv[c] = load(vj + W * c);
      for (int r = 0; r < ROWS; ++r) {
        const vf p = set1(s[r * CH + j]);
        for (int c = 0; c < NC; ++c) acc[r][c] = fmadd(p, vv[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    // all keys masked: every weight is 0 and so is the row, as SDPA's CPU flash kernel
    const vf inv = set1(top[r] == -std::numeric_limits<float>::infinity() ? 0.0f : 1.0f / reduce_add(sums[r]));
    for (int c = 0; c < NC; ++c) store(out[r] + W * c, mul(acc[r][c], inv));
  }
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
  const vf scale_v = set1(scale);
  const int64_t pairs = B * KVH, threads = at::get_num_threads();
  const int64_t parts = pairs % threads != 0 && pairs < 8 * threads ? std::min(threads, R) : 1;
  // rows per pass (attend_rows' registers: RG * NC accumulators, NC values, a weight)
  constexpr int RG = std::max(1, std::min(6, (REGS - 2) / (NC + 1)));
  at::parallel_for(0, pairs * parts, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals flush;
    std::vector<const T*> q_rows(R);
    std::vector<T*> out_rows(R);
    std::vector<const bool*> mask_rows(R, nullptr);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / parts / KVH, kvh = task / parts % KVH, part = task % parts;
      // the pair's row r = g * Q + i: query head kvh * G + g at position i; this task's rows
      // are [r0, r0 + n), its own rows 0..n-1
      const int64_t r0 = part * R / parts, n = (part + 1) * R / parts - r0;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t g = (r0 + r) / Q, i = (r0 + r) % Q, h = kvh * G + g;
        q_rows[r] = query + b * qs.b + h * qs.h + i * q_pos_stride;
        out_rows[r] = out + ((b * Q + i) * H + h) * D;
        if (mask) mask_rows[r] = mask + b * mask_b + i * mask_q;
      }
      // keys before the first one any row sees (a row's left padding) are skipped, from a
      // multiple of CH on (attend_rows: the same result)
      int64_t j_lo = 0;
      if (mask) {
        j_lo = L;
        for (int64_t i = 0; i < Q; ++i) {
          const bool* m = mask + b * mask_b + i * mask_q;
          int64_t j = 0;
          while (j < j_lo && !m[j * mask_l]) ++j;
          j_lo = j;
        }
        j_lo = j_lo == L ? 0 : j_lo / CH * CH;
      }
      // the next task's, where there are many short streams (batched rows), unless it is
      // another part of this pair (in cache); one row's longer streams the hardware prefetches
      Rows next_keys, next_values;
      if (B > 1 && task + 1 < end && (task + 1) / parts != task / parts) {
        const int64_t nb = (task + 1) / parts / KVH, nkvh = (task + 1) / parts % KVH;
        const int row_bytes = static_cast<int>(D * sizeof(T));
        next_keys = Rows{reinterpret_cast<const char*>(keys + nb * ks.b + nkvh * ks.h), ks.l * int64_t(sizeof(T)), L, row_bytes};
        next_values = Rows{reinterpret_cast<const char*>(values + nb * vs.b + nkvh * vs.h), vs.l * int64_t(sizeof(T)), L, row_bytes};
      }
      const T* k = keys + b * ks.b + kvh * ks.h;
      const T* v = values + b * vs.b + kvh * vs.h;
      const int64_t groups = (n + RG - 1) / RG;
      for (int64_t group = 0, g0 = 0; group < groups; ++group) {  // groups of near-equal size
        const int rows = static_cast<int>((group + 1) * n / groups - g0);
        // keys after the last one a row of the group sees (causal rows: the later positions'
        // keys) end its pass, at a multiple of CH: the chunks skipped are fully masked
        int64_t j_hi = L;
        if (mask) {
          j_hi = j_lo;
          for (int r = 0; r < rows; ++r) {
            const bool* m = mask_rows[g0 + r];
            int64_t j = L;
            while (j > j_hi && !m[(j - 1) * mask_l]) --j;
            j_hi = j;
          }
          j_hi = std::min(L, (j_hi + CH - 1) / CH * CH);
        }
        const Rows none;
        const Rows& nk = g0 == 0 ? next_keys : none;
        const Rows& nv = g0 == 0 ? next_values : none;
        switch (rows) {
#define DFLASH_ROWS(c)                                                                                               \
  case c:                                                                                                            \
    if constexpr (c <= RG)                                                                                           \
      attend_rows<NC, c>(k, ks.l, v, vs.l, j_lo, j_hi, q_rows.data() + g0, mask_rows.data() + g0, mask_l, scale_v, \
                         out_rows.data() + g0, nk, nv);                                                              \
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
        g0 += rows;
      }
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
