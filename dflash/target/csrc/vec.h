// Vector helpers shared by decode_attention.cpp and layer_ops.cpp (AVX-512F/BW/DQ/VL and
// AVX512-BF16): loads of float32 or bfloat16 as 16 float32 lanes, stores that round to
// bfloat16 once (nearest even), and e^x for x <= 0.
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

namespace dflash_vec {

// e^x for x <= 0 (scores minus their row's maximum), lanes of -inf (masked) and below
// -103 give 0: n = round(x / ln 2), r = x - n ln 2 in two parts, e^r by Cephes' expf
// polynomial, times 2^n by scalef.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-103.0f);
  const __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

inline __m512 load_f32(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load_f32(const at::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

inline void store(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

}  // namespace dflash_vec
