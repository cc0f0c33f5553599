// y = x @ w.T (+ bias) for a few rows of x, reading the weight from memory once whatever
// the row count. Part of module.cpp (dflash.engine.kernels builds it per instruction set,
// packs the weights with `pack` in tiles of the module's `tile_columns[dtype]` and calls it
// where it measures fastest).
//
// x: (M, K) row-major; y: (M, N); bias: (N,) or none; all in the weight's dtype.
// Packed weight, T = the dtype's TILE columns (NB vectors, below):
//   float32: (N/T, K, T), packed[t][k][c] = w[T t + c][k];
//   bfloat16: (N/T, K/2, T, 2), packed[t][p][c][e] = w[T t + c][2p + e].
// A thread owns tiles of T output columns; each tile's weights are one contiguous stream
// that passes from memory into L2 once while every chunk of rows of x runs over them:
// rows x NB vector accumulators, a broadcast of x, no horizontal sums. With a few chunks, the
// chunks after the first would read the tile from L2 while the memory bus idles, so every
// chunk also prefetches its share of the thread's next tile into L2: the weight stream keeps
// flowing while the rows' arithmetic runs. float32 accumulates with FMA; bfloat16 with
// AVX512-BF16 dot products of pairs into float32 where the CPU has them, elsewhere by
// widening each pair of weights to float32 in registers (half the bytes read, as llama.cpp);
// either way rounded once (to nearest even) at the end, as oneDNN.
// Needs N % T == 0 and even K; kernels.py checks both before calling.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec.h"

namespace {

using namespace dflash_vec;

// Per dtype: NB vectors per tile row (a tile is NB * W output columns, a power of two) and at
// most MT rows of x per chunk, MT x NB accumulators in registers: the fastest of the shapes
// timed on SmolLM2's weights at 1-16 rows (docs/design.md, "Measured figures"). AVX-512's 32
// registers: tiles of 2 vectors, up to 12 rows (24 accumulators) in both dtypes, so the 3-12
// rows of a draft block run over each tile once, in one chunk. AVX2's 16: float32 in tiles of 2
// vectors, up to 6 rows (12 accumulators); widened bfloat16 in tiles of 4, 4 rows (its
// broadcasts and weights then come from L1). NEON (32 registers, not yet timed): 4 x 4.
#if defined(DFLASH_AVX512)
constexpr int NB_F32 = 2, MT_F32 = 12, NB_BF16 = 2, MT_BF16 = 12;
#elif defined(DFLASH_AVX2)
constexpr int NB_F32 = 2, MT_F32 = 6, NB_BF16 = 4, MT_BF16 = 4;
#else
constexpr int NB_F32 = 4, MT_F32 = 4, NB_BF16 = 4, MT_BF16 = 4;
#endif
constexpr int AHEAD_ROWS = 32;  // more rows are bound by arithmetic (prefill, batches)

// A chunk's share of the next tile to bring into L2: `lines` cache lines from `start`,
// `per_step` of them at each k step.
struct Ahead {
  const char* start = nullptr;
  int64_t lines = 0;
  int per_step = 0;
  inline void at(int64_t step) const {
    for (int i = 0; i < per_step; ++i) {
      const int64_t line = step * per_step + i;
      if (line < lines) prefetch_l2(start + line * 64);
    }
  }
};

// The `bytes` of one k step (float32) or pair step (bfloat16) of a tile, 4 KiB (float32) or
// 8 KiB (bfloat16) ahead, into L1; past the tile's end is harmless.
template <typename T>
inline void prefetch_step(const T* step, int bytes) {
  const char* at = reinterpret_cast<const char*>(step) + (sizeof(T) == 4 ? 4096 : 8192);
  for (int line = 0; line < bytes; line += 64) prefetch_l1(at + line);
}

// T: the weight's (and y's) type; X: x's as the chunks read it
struct F32 {
  using T = float;
  using X = float;
  static constexpr int NB = NB_F32, MT = MT_F32, TILE = NB * W;

  template <int M, bool AHEAD>
  static void run(const float* x, const float* tile, const float* bias, float* y, int64_t K, int64_t N, int64_t n0,
                  int64_t m0, const Ahead& ahead) {
    vf acc[M][NB];
    for (int j = 0; j < M; ++j)
      for (int b = 0; b < NB; ++b) acc[j][b] = bias ? load(bias + n0 + b * W) : zero();
    for (int64_t k = 0; k < K; ++k) {
      const float* w = tile + k * TILE;
      prefetch_step(w, TILE * 4);
      if constexpr (AHEAD) ahead.at(k);
      vf wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = load(w + b * W);
      for (int j = 0; j < M; ++j) {
        const vf xv = set1(x[(m0 + j) * K + k]);
        for (int b = 0; b < NB; ++b) acc[j][b] = fmadd(xv, wv[b], acc[j][b]);
      }
    }
    for (int j = 0; j < M; ++j)
      for (int b = 0; b < NB; ++b) store(y + (m0 + j) * N + n0 + b * W, acc[j][b]);
  }
};

struct BF16 {
  using T = bf16;
#if defined(DFLASH_BF16_DOT)
  using X = bf16;  // pairs of x for the dot products
#else
  using X = float;  // widened once per call (run_all): a broadcast is then one load
#endif
  static constexpr int NB = NB_BF16, MT = MT_BF16, TILE = NB * W;

  template <int M, bool AHEAD>
  static void run(const X* x, const bf16* tile, const bf16* bias, bf16* y, int64_t K, int64_t N, int64_t n0,
                  int64_t m0, const Ahead& ahead) {
    vf acc[M][NB];
    for (int j = 0; j < M; ++j)
      for (int b = 0; b < NB; ++b) acc[j][b] = bias ? load(bias + n0 + b * W) : zero();
    const int64_t pairs = K / 2;
    for (int64_t p = 0; p < pairs; ++p) {
      const bf16* w = tile + p * 2 * TILE;
      prefetch_step(w, TILE * 4);
      if constexpr (AHEAD) ahead.at(p);
#if defined(DFLASH_BF16_DOT)
      __m512bh wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(w + b * 2 * W);
      for (int j = 0; j < M; ++j) {
        int32_t two;
        std::memcpy(&two, x + (m0 + j) * K + 2 * p, sizeof(two));
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(two);
        for (int b = 0; b < NB; ++b) acc[j][b] = _mm512_dpbf16_ps(acc[j][b], xv, wv[b]);
      }
#else
      vf x_even[M], x_odd[M];
      for (int j = 0; j < M; ++j) {
        x_even[j] = set1(x[(m0 + j) * K + 2 * p]);
        x_odd[j] = set1(x[(m0 + j) * K + 2 * p + 1]);
      }
      for (int b = 0; b < NB; ++b) {
        const vf even = even_of_pairs(w + b * 2 * W), odd = odd_of_pairs(w + b * 2 * W);
        for (int j = 0; j < M; ++j) acc[j][b] = fmadd(x_odd[j], odd, fmadd(x_even[j], even, acc[j][b]));
      }
#endif
    }
    for (int j = 0; j < M; ++j)
      for (int b = 0; b < NB; ++b) store(y + (m0 + j) * N + n0 + b * W, acc[j][b]);
  }
};

// Chunk::run for `rows` (1..R) rows, a template argument
template <typename Chunk, bool AHEAD, int R = Chunk::MT>
inline void run_rows(int64_t rows, const typename Chunk::X* x, const typename Chunk::T* tile,
                     const typename Chunk::T* bias, typename Chunk::T* y, int64_t K, int64_t N, int64_t n0, int64_t m0,
                     const Ahead& ahead) {
  if (rows == R) {
    Chunk::template run<R, AHEAD>(x, tile, bias, y, K, N, n0, m0, ahead);
  } else if constexpr (R > 1) {
    run_rows<Chunk, AHEAD, R - 1>(rows, x, tile, bias, y, K, N, n0, m0, ahead);
  }
}

// Every row of x over one tile, in `count` chunks of at most MT rows whose sizes differ by one
// at most (8 rows in chunks of 6: 4 and 4, whose accumulators all hide the FMA latency, not 6
// and 2); chunk c gets ahead(c).
template <typename Chunk, bool AHEAD, typename Share>
void chunks(const typename Chunk::X* x, const typename Chunk::T* tile, const typename Chunk::T* bias,
            typename Chunk::T* y, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t count, Share ahead) {
  int64_t m0 = 0;
  for (int64_t c = 0; c < count; ++c) {
    const int64_t rows = (M - m0 + count - c - 1) / (count - c);
    run_rows<Chunk, AHEAD>(rows, x, tile, bias, y, K, N, n0, m0, ahead(c));
    m0 += rows;
  }
}

// One tile for every row of x; with 2 or more chunks of at most AHEAD_ROWS rows and a next
// tile (the thread's, or null), chunk c also prefetches the c-th of the chunks' equal shares
// of it into L2. Otherwise the chunks run without a prefetch instruction added.
template <typename Chunk>
void tile(const typename Chunk::X* x, const typename Chunk::T* packed, const typename Chunk::T* bias,
          typename Chunk::T* y, int64_t M, int64_t K, int64_t N, int64_t t, const typename Chunk::T* next) {
  using T = typename Chunk::T;
  const T* own = packed + t * K * Chunk::TILE;
  const int64_t count = (M + Chunk::MT - 1) / Chunk::MT;
  if (next == nullptr || count < 2 || M > AHEAD_ROWS) {
    chunks<Chunk, false>(x, own, bias, y, M, K, N, t * Chunk::TILE, count, [](int64_t) { return Ahead{}; });
    return;
  }
  const int64_t steps = sizeof(T) == 2 ? K / 2 : K;  // k steps of a chunk (bfloat16: pairs of k)
  const int64_t lines = K * Chunk::TILE * static_cast<int64_t>(sizeof(T)) / 64;  // the tile's cache lines
  const int64_t share = (lines + count - 1) / count;
  chunks<Chunk, true>(x, own, bias, y, M, K, N, t * Chunk::TILE, count, [&](int64_t chunk) {
    return Ahead{reinterpret_cast<const char*>(next) + chunk * share * 64, std::min(share, lines - chunk * share),
                 static_cast<int>((share + steps - 1) / steps)};
  });
}

template <typename Chunk>
void run_all(const typename Chunk::T* x, const typename Chunk::T* packed, const typename Chunk::T* bias,
             typename Chunk::T* y, int64_t M, int64_t K, int64_t N) {
  using X = typename Chunk::X;
  std::vector<float> widened;
  const X* rows;
  if constexpr (std::is_same_v<X, typename Chunk::T>) {
    rows = x;
  } else {
    widened.assign(x, x + M * K);  // bfloat16 to float32, exact
    rows = widened.data();
  }
  at::parallel_for(0, N / Chunk::TILE, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals flush;  // for this thread's tiles
    for (int64_t t = begin; t < end; ++t) {
      const typename Chunk::T* next = t + 1 < end ? packed + (t + 1) * K * Chunk::TILE : nullptr;
      tile<Chunk>(rows, packed, bias, y, M, K, N, t, next);
    }
  });
}

}  // namespace

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                           int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.is_contiguous(), "small_linear: x (M, K) contiguous");
  TORCH_CHECK(x.scalar_type() == packed.scalar_type(), "small_linear: x and the weight differ in dtype");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t tile = x.scalar_type() == at::kFloat ? F32::TILE : BF16::TILE;
  TORCH_CHECK(N % tile == 0 && K % 2 == 0 && packed.numel() == N * K, "small_linear: N % tile_columns, K % 2, packed size");
  auto y = at::empty({M, N}, x.options());
  const bool has_bias = bias.has_value() && bias->defined();
  if (x.scalar_type() == at::kFloat) {
    run_all<F32>(x.data_ptr<float>(), packed.data_ptr<float>(), has_bias ? bias->data_ptr<float>() : nullptr,
                        y.data_ptr<float>(), M, K, N);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "small_linear: float32 or bfloat16");
    run_all<BF16>(x.data_ptr<bf16>(), packed.data_ptr<bf16>(), has_bias ? bias->data_ptr<bf16>() : nullptr,
                        y.data_ptr<bf16>(), M, K, N);
  }
  return y;
}
