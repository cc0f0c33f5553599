// The vector layer every kernel in this directory is written over: one source per kernel,
// one block per instruction set here. dflash.engine.kernels builds the module once per
// instruction set it runs, defining one of
//   DFLASH_ISA_AVX512_BF16  AVX-512F/BW/VL/DQ and AVX512-BF16 (Sapphire Rapids, Zen 4 on)
//   DFLASH_ISA_AVX512       AVX-512F/BW/VL/DQ without bfloat16 dot products (Skylake-X, Ice Lake)
//   DFLASH_ISA_AVX2         AVX2 and FMA (every x86-64 since Haswell and Zen 1)
//   DFLASH_ISA_NEON         Arm NEON (every aarch64 CPU)
// A vector `vf` holds W float32 lanes; REGS is the ISA's vector register count (kernels size
// their register blocks from it). bfloat16 is loaded as float32 lanes and stored rounded once,
// to nearest even, as the hardware conversion does; only AVX512-BF16 has bfloat16 dot products
// (DFLASH_BF16_DOT), everywhere else a kernel widens bfloat16 in registers, so a
// memory-bound kernel still reads half the bytes of float32.
// Invariants: every ISA computes the same function; results differ in summation order and
// in the last bit at most (exp_nonpositive is one algorithm for all: about 1 ulp).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

#if defined(DFLASH_ISA_AVX512_BF16)
#define DFLASH_AVX512 1
#define DFLASH_BF16_DOT 1
#elif defined(DFLASH_ISA_AVX512)
#define DFLASH_AVX512 1
#elif defined(DFLASH_ISA_AVX2)
#define DFLASH_AVX2 1
#elif defined(DFLASH_ISA_NEON)
#define DFLASH_NEON 1
#else
#error "define one of DFLASH_ISA_AVX512_BF16, DFLASH_ISA_AVX512, DFLASH_ISA_AVX2, DFLASH_ISA_NEON"
#endif

#if defined(DFLASH_NEON)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif

namespace dflash_vec {

using bf16 = c10::BFloat16;

inline void prefetch_l1(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

#if defined(DFLASH_AVX512)
// ---------------------------------------------------------------- AVX-512: 16 lanes, 32 registers
using vf = __m512;
constexpr int W = 16;
constexpr int REGS = 32;
#if defined(DFLASH_BF16_DOT)
constexpr const char* ISA = "avx512_bf16";
#else
constexpr const char* ISA = "avx512";
#endif

inline vf zero() { return _mm512_setzero_ps(); }
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline vf load(const bf16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
// v's lanes as bfloat16 bits, rounded to nearest even (NaN: a quiet NaN)
inline __m256i to_bf16_bits(vf v) {
#if defined(DFLASH_BF16_DOT)
  return (__m256i)_mm512_cvtneps_pbh(v);
#else
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(rounded);
#endif
}
inline void store(bf16* p, vf v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits(v)); }
inline vf round_bf16(vf v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16_bits(v)), 16)); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf abs(vf a) { return _mm512_abs_ps(a); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }  // a b + c
inline vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline float reduce_add(vf v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(vf v) { return _mm512_reduce_max_ps(v); }
inline vf round_nearest(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf scale_pow2(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p 2^n, n integral
inline vf where_negative(vf g, vf a, vf b) { return _mm512_mask_mov_ps(b, _mm512_cmp_ps_mask(g, zero(), _CMP_LT_OQ), a); }
inline vf where_at_least(vf x, vf lo, vf y) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y); }
inline unsigned nan_lanes(vf v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
inline unsigned equal_lanes(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
// W (column) pairs of bfloat16 (k, k+1) as the float32 lanes of the k's and of the k+1's
inline vf even_of_pairs(const bf16* p) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16)); }
inline vf odd_of_pairs(const bf16* p) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
// the sums of a[0], ..., a[15] as the lanes of one vector, in order
inline vf lane_sums(const vf* a) {
  __m512 t[8], u[4];
  for (int k = 0; k < 8; ++k)
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {
    const __m512d x = _mm512_castps_pd(t[2 * k]), y = _mm512_castps_pd(t[2 * k + 1]);
    u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // u[k], 128-bit lane j, element m: part j of the sum of a[4k + m]
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

#elif defined(DFLASH_AVX2)
// ---------------------------------------------------------------- AVX2 + FMA: 8 lanes, 16 registers
using vf = __m256;
constexpr int W = 8;
constexpr int REGS = 16;
constexpr const char* ISA = "avx2";

inline vf zero() { return _mm256_setzero_ps(); }
inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline vf load(const bf16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline __m128i to_bf16_bits(vf v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}
inline void store(bf16* p, vf v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits(v)); }
inline vf round_bf16(vf v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(to_bf16_bits(v)), 16)); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf abs(vf a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline float reduce_add(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float reduce_max(vf v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline vf round_nearest(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// p 2^n for integral n in [-149, 64]: 2^(n + 64) is a normal float, then one rounding by 2^-64
inline vf scale_pow2(vf p, vf n) {
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127 + 64)), 23);
  return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(5.421010862427522e-20f));
}
inline vf where_negative(vf g, vf a, vf b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(g, zero(), _CMP_LT_OQ)); }
inline vf where_at_least(vf x, vf lo, vf y) { return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), y); }
inline unsigned nan_lanes(vf v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)); }
inline unsigned equal_lanes(vf a, vf b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
inline vf even_of_pairs(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), 16));
}
inline vf odd_of_pairs(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                              _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline vf lane_sums(const vf* a) {
  // hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  // u0 = [a0..a3 over lanes 0-3 | a0..a3 over lanes 4-7], u1 likewise for a4..a7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#else
// ---------------------------------------------------------------- NEON (aarch64): 4 lanes, 32 registers
using vf = float32x4_t;
constexpr int W = 4;
constexpr int REGS = 32;
constexpr const char* ISA = "neon";

inline vf zero() { return vdupq_n_f32(0.0f); }
inline vf set1(float x) { return vdupq_n_f32(x); }
inline vf load(const float* p) { return vld1q_f32(p); }
inline vf load(const bf16* p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
}
inline void store(float* p, vf v) { vst1q_f32(p, v); }
inline uint16x4_t to_bf16_bits(vf v) {
  const uint32x4_t bits = vreinterpretq_u32_f32(v);
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
  uint32x4_t rounded = vaddq_u32(bits, vaddq_u32(odd, vdupq_n_u32(0x7FFF)));
  rounded = vbslq_u32(vceqq_f32(v, v), rounded, vdupq_n_u32(0x7FC00000u));
  return vshrn_n_u32(rounded, 16);
}
inline void store(bf16* p, vf v) { vst1_u16(reinterpret_cast<uint16_t*>(p), to_bf16_bits(v)); }
inline vf round_bf16(vf v) { return vreinterpretq_f32_u32(vshll_n_u16(to_bf16_bits(v), 16)); }
inline vf add(vf a, vf b) { return vaddq_f32(a, b); }
inline vf sub(vf a, vf b) { return vsubq_f32(a, b); }
inline vf mul(vf a, vf b) { return vmulq_f32(a, b); }
inline vf div(vf a, vf b) { return vdivq_f32(a, b); }
inline vf max(vf a, vf b) { return vmaxq_f32(a, b); }
inline vf abs(vf a) { return vabsq_f32(a); }
inline vf fmadd(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
inline vf fnmadd(vf a, vf b, vf c) { return vfmsq_f32(c, a, b); }
inline float reduce_add(vf v) { return vaddvq_f32(v); }
inline float reduce_max(vf v) { return vmaxvq_f32(v); }
inline vf round_nearest(vf v) { return vrndnq_f32(v); }
inline vf scale_pow2(vf p, vf n) {
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127 + 64)), 23);
  return vmulq_f32(vmulq_f32(p, vreinterpretq_f32_s32(e)), vdupq_n_f32(5.421010862427522e-20f));
}
inline vf where_negative(vf g, vf a, vf b) { return vbslq_f32(vcltq_f32(g, zero()), a, b); }
inline vf where_at_least(vf x, vf lo, vf y) {
  return vreinterpretq_f32_u32(vandq_u32(vcgeq_f32(x, lo), vreinterpretq_u32_f32(y)));
}
inline unsigned lanes_of(uint32x4_t m) {
  const uint32_t bit[4] = {1, 2, 4, 8};
  return vaddvq_u32(vandq_u32(m, vld1q_u32(bit)));
}
inline unsigned nan_lanes(vf v) { return lanes_of(vmvnq_u32(vceqq_f32(v, v))); }
inline unsigned equal_lanes(vf a, vf b) { return lanes_of(vceqq_f32(a, b)); }
inline vf even_of_pairs(const bf16* p) {
  return vreinterpretq_f32_u32(vshlq_n_u32(vld1q_u32(reinterpret_cast<const uint32_t*>(p)), 16));
}
inline vf odd_of_pairs(const bf16* p) {
  return vreinterpretq_f32_u32(vandq_u32(vld1q_u32(reinterpret_cast<const uint32_t*>(p)), vdupq_n_u32(0xFFFF0000u)));
}
inline vf lane_sums(const vf* a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }
#endif

// Denormal inputs and results (silu of a very negative number, tiny softmax weights) take
// microcode assists that cost 100x on x86; flushed to zero while a guard lives, as MKL and
// oneDNN do (x86: MXCSR FTZ and DAZ; aarch64: FPCR FZ).
struct FlushDenormals {
#if defined(DFLASH_NEON)
  uint64_t saved;
  FlushDenormals() {
    asm volatile("mrs %0, fpcr" : "=r"(saved));
    asm volatile("msr fpcr, %0" : : "r"(saved | (uint64_t{1} << 24)));
  }
  ~FlushDenormals() { asm volatile("msr fpcr, %0" : : "r"(saved)); }
#else
  unsigned int saved;
  FlushDenormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// e^x for x <= 0 (scores minus their row's maximum); lanes of -inf (masked) and below -103
// give 0: n = round(x / ln 2), r = x - n ln 2 in two parts, e^r by Cephes' expf polynomial,
// times 2^n.
inline vf exp_nonpositive(vf x) {
  const vf lo = set1(-103.0f);
  const vf clamped = max(x, lo);
  const vf n = round_nearest(mul(clamped, set1(1.44269504088896341f)));
  vf r = fnmadd(n, set1(0.693359375f), clamped);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  vf p = set1(1.9875691500e-4f);
  p = fmadd(p, r, set1(1.3981999507e-3f));
  p = fmadd(p, r, set1(8.3334519073e-3f));
  p = fmadd(p, r, set1(4.1665795894e-2f));
  p = fmadd(p, r, set1(1.6666665459e-1f));
  p = fmadd(p, r, set1(5.0000001201e-1f));
  p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
  return where_at_least(x, lo, scale_pow2(p, n));
}

}  // namespace dflash_vec
