// y = x @ w.T (+ bias) for a few rows of x, reading the weight from memory once whatever
// the row count. dflash.target.kernels builds this file once per machine (torch's
// cpp_extension), packs the weights (`pack` in kernels.py) and calls it where it measures
// fastest.
//
// x: (M, K) row-major; y: (M, N); bias: (N,) or none; all in the weight's dtype.
// Packed weight, float32: (N/64, K, 64), packed[t][k][c] = w[64t + c][k].
//                bfloat16: (N/64, K/2, 64, 2), packed[t][p][c][e] = w[64t + c][2p + e].
// A thread owns tiles of 64 output columns; each tile's weights are one contiguous stream
// that passes from memory into L2 once while every 4-row chunk of x runs over them: 16
// vector accumulators, a broadcast of x, no horizontal sums. With 5 to 32 rows the chunks
// after the first would read the tile from L2 while the memory bus idles, so every chunk
// also prefetches its share of the thread's next tile into L2: the weight stream keeps
// flowing while the rows' arithmetic runs (docs/results/engine-2026-11-27g-amd). float32
// accumulates with FMA; bfloat16 with AVX512-BF16 dot products of pairs into float32,
// rounded once (round to nearest even) at the end, as oneDNN.
// Needs AVX-512F/BW/VL and AVX512-BF16 (Intel Sapphire Rapids and later, AMD Zen 4 and
// later), N % 64 == 0 and even K; kernels.py checks all of it before calling.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor arguments; torch/extension.h takes twice as long to compile
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <tuple>

namespace {

constexpr int MT = 4;  // rows of x per chunk
constexpr int NB = 4;  // 16-column blocks per tile
constexpr int PREFETCH = 16;  // k steps ahead (4 KiB of the tile's stream); past its end is harmless
constexpr int AHEAD_CHUNKS = 8;  // up to 32 rows; more rows are bound by arithmetic (prefill, batches)

// A chunk's share of the next tile to bring into L2: `lines` cache lines from `start`,
// `per_step` of them at each k step.
struct Ahead {
  const char* start = nullptr;
  int64_t lines = 0;
  int per_step = 0;
  inline void at(int64_t step) const {
    for (int i = 0; i < per_step; ++i) {
      const int64_t line = step * per_step + i;
      if (line < lines) _mm_prefetch(start + line * 64, _MM_HINT_T1);
    }
  }
};

template <int M, int B, bool AHEAD>
void chunk_f32(const float* x, const float* packed, const float* bias, float* y, int64_t K, int64_t N, int64_t b0,
               int64_t m0, const Ahead& ahead) {
  __m512 acc[M][B];
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < B; ++b) acc[j][b] = bias ? _mm512_loadu_ps(bias + (b0 + b) * 16) : _mm512_setzero_ps();
  const float* w = packed + b0 * K * 16;
  for (int64_t k = 0; k < K; ++k) {
    __m512 wv[B];
    for (int b = 0; b < B; ++b) _mm_prefetch(reinterpret_cast<const char*>(w + (k + PREFETCH) * 64 + b * 16), _MM_HINT_T0);
    if constexpr (AHEAD) ahead.at(k);
    for (int b = 0; b < B; ++b) wv[b] = _mm512_loadu_ps(w + k * 64 + b * 16);
    for (int j = 0; j < M; ++j) {
      __m512 xv = _mm512_set1_ps(x[(m0 + j) * K + k]);
      for (int b = 0; b < B; ++b) acc[j][b] = _mm512_fmadd_ps(xv, wv[b], acc[j][b]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(y + (m0 + j) * N + (b0 + b) * 16, acc[j][b]);
}

template <int M, int B, bool AHEAD>
void chunk_bf16(const at::BFloat16* x, const at::BFloat16* packed, const at::BFloat16* bias, at::BFloat16* y,
                int64_t K, int64_t N, int64_t b0, int64_t m0, const Ahead& ahead) {
  __m512 acc[M][B];
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < B; ++b) {
      if (bias) {
        __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + (b0 + b) * 16));
        acc[j][b] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      } else {
        acc[j][b] = _mm512_setzero_ps();
      }
    }
  const int64_t pairs = K / 2;
  const at::BFloat16* w = packed + b0 * K * 16;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[B];
    for (int b = 0; b < B; ++b) _mm_prefetch(reinterpret_cast<const char*>(w + (p + 2 * PREFETCH) * 128 + b * 32), _MM_HINT_T0);
    if constexpr (AHEAD) ahead.at(p);
    for (int b = 0; b < B; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(w + p * 128 + b * 32);
    for (int j = 0; j < M; ++j) {
      int32_t two;
      std::memcpy(&two, x + (m0 + j) * K + 2 * p, sizeof(two));
      __m512bh xv = (__m512bh)_mm512_set1_epi32(two);
      for (int b = 0; b < B; ++b) acc[j][b] = _mm512_dpbf16_ps(acc[j][b], xv, wv[b]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < B; ++b) {
      __m256bh out = _mm512_cvtneps_pbh(acc[j][b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m0 + j) * N + (b0 + b) * 16), (__m256i)out);
    }
}

// Every row of x over one tile, in chunks of MT rows; chunk c gets ahead(c).
template <typename T, int B, typename Chunk, bool AHEAD, typename Share>
void chunks(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N, int64_t b0,
            Share ahead) {
  int64_t m0 = 0;
  for (; m0 + MT <= M; m0 += MT) Chunk::template run<MT, B, AHEAD>(x, packed, bias, y, K, N, b0, m0, ahead(m0 / MT));
  switch (M - m0) {
    case 3: Chunk::template run<3, B, AHEAD>(x, packed, bias, y, K, N, b0, m0, ahead(m0 / MT)); break;
    case 2: Chunk::template run<2, B, AHEAD>(x, packed, bias, y, K, N, b0, m0, ahead(m0 / MT)); break;
    case 1: Chunk::template run<1, B, AHEAD>(x, packed, bias, y, K, N, b0, m0, ahead(m0 / MT)); break;
    default: break;
  }
}

// One tile of B column blocks for every row of x; with 2 to AHEAD_CHUNKS chunks and a next
// tile (the thread's, or null), chunk c also prefetches the c-th of the chunks' equal shares
// of it into L2. Otherwise the chunks run without a prefetch instruction added.
template <typename T, int B, typename Chunk>
void tile(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N, int64_t b0, const T* next) {
  const int64_t count = (M + MT - 1) / MT;
  if (next == nullptr || count < 2 || count > AHEAD_CHUNKS) {
    chunks<T, B, Chunk, false>(x, packed, bias, y, M, K, N, b0, [](int64_t) { return Ahead{}; });
    return;
  }
  const int64_t steps = sizeof(T) == 2 ? K / 2 : K;  // k steps of a chunk (bfloat16: pairs of k)
  const int64_t lines = K * B * 16 * static_cast<int64_t>(sizeof(T)) / 64;  // the tile's cache lines
  const int64_t share = (lines + count - 1) / count;
  chunks<T, B, Chunk, true>(x, packed, bias, y, M, K, N, b0, [&](int64_t chunk) {
    return Ahead{reinterpret_cast<const char*>(next) + chunk * share * 64, std::min(share, lines - chunk * share),
                 static_cast<int>((share + steps - 1) / steps)};
  });
}

struct F32 {
  template <int M, int B, bool AHEAD>
  static void run(const float* x, const float* p, const float* bias, float* y, int64_t K, int64_t N, int64_t b0,
                  int64_t m0, const Ahead& ahead) {
    chunk_f32<M, B, AHEAD>(x, p, bias, y, K, N, b0, m0, ahead);
  }
};

struct BF16 {
  template <int M, int B, bool AHEAD>
  static void run(const at::BFloat16* x, const at::BFloat16* p, const at::BFloat16* bias, at::BFloat16* y, int64_t K,
                  int64_t N, int64_t b0, int64_t m0, const Ahead& ahead) {
    chunk_bf16<M, B, AHEAD>(x, p, bias, y, K, N, b0, m0, ahead);
  }
};

template <typename T, typename Chunk>
void run_all(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N) {
  at::parallel_for(0, N / 64, 1, [&](int64_t begin, int64_t end) {
    // Denormal inputs or products (silu of a very negative number) take microcode assists
    // that cost 100x; flush them to zero, as MKL and oneDNN do, for this thread's tiles.
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);  // FTZ | DAZ
    for (int64_t t = begin; t < end; ++t) {
      const T* next = t + 1 < end ? packed + (t + 1) * K * NB * 16 : nullptr;
      tile<T, NB, Chunk>(x, packed, bias, y, M, K, N, t * NB, next);
    }
    _mm_setcsr(csr);
  });
}

}  // namespace

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                           int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.is_contiguous(), "small_linear: x (M, K) contiguous");
  TORCH_CHECK(x.scalar_type() == packed.scalar_type(), "small_linear: x and the weight differ in dtype");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(N % 64 == 0 && K % 2 == 0 && packed.numel() == N * K, "small_linear: N % 64, K % 2, packed size");
  auto y = at::empty({M, N}, x.options());
  const bool has_bias = bias.has_value() && bias->defined();
  if (x.scalar_type() == at::kFloat) {
    run_all<float, F32>(x.data_ptr<float>(), packed.data_ptr<float>(), has_bias ? bias->data_ptr<float>() : nullptr,
                        y.data_ptr<float>(), M, K, N);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "small_linear: float32 or bfloat16");
    using bf = at::BFloat16;
    run_all<bf, BF16>(x.data_ptr<bf>(), packed.data_ptr<bf>(), has_bias ? bias->data_ptr<bf>() : nullptr,
                      y.data_ptr<bf>(), M, K, N);
  }
  return y;
}

// decode_attention.cpp, built into the same module
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                               const c10::optional<at::Tensor>& mask, double scale);

// layer_ops.cpp, built into the same module
std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                            const c10::optional<at::Tensor>& delta);
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t n);
at::Tensor rope_into_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin, at::Tensor keys,
                           at::Tensor values, int64_t start, int64_t heads, int64_t kv_heads);
at::Tensor argmax_rows(const at::Tensor& x);
at::Tensor norm_rope(const at::Tensor& x, const c10::optional<at::Tensor>& weight, double eps, const at::Tensor& cos,
                     const at::Tensor& signed_sin);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x @ w.T (+ bias) for a few rows of x, from a packed weight");
  m.def("decode_attention", &decode_attention, "softmax(q k^T scale + mask) v for a few query positions (GQA)");
  m.def("rms_norm", &rms_norm, "HF's RMSNorm of rows, after an optional residual add");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of fused gate_up rows");
  m.def("norm_rope", &norm_rope, "HF's RMSNorm of each head (optional), then the rotary embedding");
  m.def("argmax_rows", &argmax_rows, "x.argmax(-1) of contiguous rows");
  m.def("rope_into_cache", &rope_into_cache, "rotary query and keys, keys and values into a layer's cache");
}
