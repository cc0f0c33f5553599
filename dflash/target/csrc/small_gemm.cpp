// y = x @ w.T (+ bias) for a few rows of x, reading the weight from memory once whatever
// the row count. dflash.target.kernels builds this file once per machine (torch's
// cpp_extension), packs the weights (`pack` in kernels.py) and calls it where it measures
// fastest.
//
// x: (M, K) row-major; y: (M, N); bias: (N,) or none; all in the weight's dtype.
// Packed weight, float32: (N/64, K, 64), packed[t][k][c] = w[64t + c][k].
//                bfloat16: (N/64, K/2, 64, 2), packed[t][p][c][e] = w[64t + c][2p + e].
// A thread owns tiles of 64 output columns; each tile's weights are one contiguous stream,
// read from memory once: every 4-row chunk of x runs over each 64-k block of it while the
// block is in L1 (16 vector accumulators, a broadcast of x, no horizontal sums; partial sums
// of all rows wait in a small float32 buffer between blocks). float32 accumulates with FMA; bfloat16 with AVX512-BF16 dot
// products of pairs into float32, rounded once (round to nearest even) at the end, as oneDNN.
// Needs AVX-512F/BW/VL and AVX512-BF16 (Intel Sapphire Rapids and later, AMD Zen 4 and
// later), N % 64 == 0 and even K; kernels.py checks all of it before calling.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int MT = 4;         // rows of x per chunk: 4 rows x 4 column blocks = 16 accumulators
constexpr int KB = 64;        // k per block: the tile's block of weights (16 KiB float32) stays in L1
constexpr int PREFETCH = 16;  // k steps ahead (4 KiB of the tile's stream); past its end is harmless

// Partial sums live in `acc` (rows x 64 floats of this tile): every chunk of rows passes over
// a k-block of the tile's weights while it is in L1, so the weights stream from memory once
// and the arithmetic of all rows overlaps that stream.
template <int M>
void chunk_f32(const float* x, const float* w, float* acc_rows, int64_t K, int64_t k0, int64_t k1, int64_t m0) {
  __m512 acc[M][4];
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < 4; ++b) acc[j][b] = _mm512_loadu_ps(acc_rows + (m0 + j) * 64 + b * 16);
  for (int64_t k = k0; k < k1; ++k) {
    __m512 wv[4];
    for (int b = 0; b < 4; ++b) _mm_prefetch(reinterpret_cast<const char*>(w + (k + PREFETCH) * 64 + b * 16), _MM_HINT_T0);
    for (int b = 0; b < 4; ++b) wv[b] = _mm512_loadu_ps(w + k * 64 + b * 16);
    for (int j = 0; j < M; ++j) {
      __m512 xv = _mm512_set1_ps(x[(m0 + j) * K + k]);
      for (int b = 0; b < 4; ++b) acc[j][b] = _mm512_fmadd_ps(xv, wv[b], acc[j][b]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < 4; ++b) _mm512_storeu_ps(acc_rows + (m0 + j) * 64 + b * 16, acc[j][b]);
}

template <int M>
void chunk_bf16(const at::BFloat16* x, const at::BFloat16* w, float* acc_rows, int64_t K, int64_t k0, int64_t k1,
                int64_t m0) {
  __m512 acc[M][4];
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < 4; ++b) acc[j][b] = _mm512_loadu_ps(acc_rows + (m0 + j) * 64 + b * 16);
  for (int64_t p = k0 / 2; p < k1 / 2; ++p) {
    __m512bh wv[4];
    for (int b = 0; b < 4; ++b) _mm_prefetch(reinterpret_cast<const char*>(w + (p + 2 * PREFETCH) * 128 + b * 32), _MM_HINT_T0);
    for (int b = 0; b < 4; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(w + p * 128 + b * 32);
    for (int j = 0; j < M; ++j) {
      int32_t two;
      std::memcpy(&two, x + (m0 + j) * K + 2 * p, sizeof(two));
      __m512bh xv = (__m512bh)_mm512_set1_epi32(two);
      for (int b = 0; b < 4; ++b) acc[j][b] = _mm512_dpbf16_ps(acc[j][b], xv, wv[b]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < 4; ++b) _mm512_storeu_ps(acc_rows + (m0 + j) * 64 + b * 16, acc[j][b]);
}

template <typename T, int M>
void chunk(const T* x, const T* w, float* acc_rows, int64_t K, int64_t k0, int64_t k1, int64_t m0) {
  if constexpr (std::is_same_v<T, float>) {
    chunk_f32<M>(x, w, acc_rows, K, k0, k1, m0);
  } else {
    chunk_bf16<M>(x, w, acc_rows, K, k0, k1, m0);
  }
}

inline float to_float(float v) { return v; }
inline float to_float(at::BFloat16 v) { return static_cast<float>(v); }

template <typename T>
void store(T* y, const float* acc_rows, int64_t M, int64_t N, int64_t col) {
  for (int64_t m = 0; m < M; ++m) {
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(y + m * N + col, acc_rows + m * 64, 64 * sizeof(float));
    } else {
      for (int b = 0; b < 4; ++b) {
        __m256bh out = _mm512_cvtneps_pbh(_mm512_loadu_ps(acc_rows + m * 64 + b * 16));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * N + col + b * 16), (__m256i)out);
      }
    }
  }
}

// One tile of 64 output columns for every row of x: k-blocks outside, chunks of MT rows inside.
template <typename T>
void tile(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N, int64_t t,
          std::vector<float>& acc_rows) {
  acc_rows.resize(M * 64);
  for (int64_t m = 0; m < M; ++m)
    for (int c = 0; c < 64; ++c) acc_rows[m * 64 + c] = bias ? to_float(bias[t * 64 + c]) : 0.0f;
  const T* w = packed + t * 64 * K;
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t k1 = std::min<int64_t>(K, k0 + KB);
    int64_t m0 = 0;
    for (; m0 + MT <= M; m0 += MT) chunk<T, MT>(x, w, acc_rows.data(), K, k0, k1, m0);
    switch (M - m0) {
      case 3: chunk<T, 3>(x, w, acc_rows.data(), K, k0, k1, m0); break;
      case 2: chunk<T, 2>(x, w, acc_rows.data(), K, k0, k1, m0); break;
      case 1: chunk<T, 1>(x, w, acc_rows.data(), K, k0, k1, m0); break;
      default: break;
    }
  }
  store(y, acc_rows.data(), M, N, t * 64);
}

template <typename T>
void run_all(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N) {
  at::parallel_for(0, N / 64, 1, [&](int64_t begin, int64_t end) {
    // Denormal inputs or products (silu of a very negative number) take microcode assists
    // that cost 100x; flush them to zero, as MKL and oneDNN do, for this thread's tiles.
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);  // FTZ | DAZ
    std::vector<float> acc_rows;
    for (int64_t t = begin; t < end; ++t) tile<T>(x, packed, bias, y, M, K, N, t, acc_rows);
    _mm_setcsr(csr);
  });
}

}  // namespace

torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                           int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.is_contiguous(), "small_linear: x (M, K) contiguous");
  TORCH_CHECK(x.scalar_type() == packed.scalar_type(), "small_linear: x and the weight differ in dtype");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(N % 64 == 0 && K % 2 == 0 && packed.numel() == N * K, "small_linear: N % 64, K % 2, packed size");
  auto y = torch::empty({M, N}, x.options());
  const bool has_bias = bias.has_value() && bias->defined();
  if (x.scalar_type() == torch::kFloat) {
    run_all<float>(x.data_ptr<float>(), packed.data_ptr<float>(), has_bias ? bias->data_ptr<float>() : nullptr,
                        y.data_ptr<float>(), M, K, N);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "small_linear: float32 or bfloat16");
    using bf = at::BFloat16;
    run_all<bf>(x.data_ptr<bf>(), packed.data_ptr<bf>(), has_bias ? bias->data_ptr<bf>() : nullptr,
                      y.data_ptr<bf>(), M, K, N);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x @ w.T (+ bias) for a few rows of x, from a packed weight");
}
