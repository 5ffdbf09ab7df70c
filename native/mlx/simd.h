// Portable 8-float vectors (GCC vector extensions) for kernels compiled once and cloned per
// ISA with target_clones (AVX-512, AVX2, baseline), so they need no -m flags. Eight floats is
// one AVX2 register: a 16-float type made GCC keep accumulator arrays on the stack in the
// AVX2 clone. Include only from translation units whose kernels are cloned this way, or that
// are built once per ISA with that ISA's flags (kernels/attention_<isa>.cpp).
#pragma once

#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#pragma GCC diagnostic ignored "-Wpsabi"  // helpers are always inlined into each clone

#if defined(__x86_64__)
#define LLMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLMD_CLONES
#endif

namespace llmd::simd {

constexpr int kLanes = 8;
using vf = float __attribute__((vector_size(32)));
using vfi = int __attribute__((vector_size(32)));

[[gnu::always_inline]] inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
[[gnu::always_inline]] inline vf splat(float x) { return vf{} + x; }

// floor(y) for |y| < 2^31. Where the translation unit is built with AVX-512 (the attention
// kernels' 16-lane variant), one rounding instruction on 16-float vectors instead of a
// truncation, a conversion back and a correction: the same integer either way.
template <class V, class VI>
[[gnu::always_inline]] inline V floor_n(V y) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    __m512 v;
    std::memcpy(&v, &y, sizeof(v));
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    V out;
    std::memcpy(&out, &v, sizeof(v));
    return out;
  }
#endif
  const V t = __builtin_convertvector(__builtin_convertvector(y, VI), V);
  return t - ((t > y) ? V{} + 1.f : V{});
}

// p * 2^n for integral n in [-126, 127]: the power of two is a normal float, so the product is
// p's exact scaling rounded once, as vscalefps computes it in one instruction (16-float vectors
// under AVX-512) instead of building 2^n from its exponent bits and multiplying.
template <class V, class VI>
[[gnu::always_inline]] inline V times_pow2_n(V p, V n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    __m512 a, b;
    std::memcpy(&a, &p, sizeof(a));
    std::memcpy(&b, &n, sizeof(b));
    a = _mm512_scalef_ps(a, b);
    V out;
    std::memcpy(&out, &a, sizeof(a));
    return out;
  }
#endif
  const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// exp(x): Cody-Waite range reduction + degree-6 polynomial; relative error ~2e-7, 0 below
// -87, clamped to exp(88) above (softmax only ever passes x <= 0). Any width of float vector V
// with its int vector VI (the attention kernels' AVX-512 variant runs 16 lanes): the same
// arithmetic lane for lane, so every width gives the same bits. kNonPositive: the caller never
// passes x > 0 (a softmax's score minus its max), so the upper clamp, which such x never reach,
// is left out (the same bits for every x it is given).
template <class V, class VI, bool kNonPositive = false>
[[gnu::always_inline]] inline V vexp_n(V x) {
  const V zero{};
  x = x < -87.f ? zero - 87.f : x;
  if constexpr (!kNonPositive) x = x > 88.f ? zero + 88.f : x;
  const V y = x * 1.44269504088896341f + 0.5f;
  const V fx = floor_n<V, VI>(y);  // in [-126, 127]
  V r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  V p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  return times_pow2_n<V, VI>(p, fx);
}

[[gnu::always_inline]] inline vf vexp(vf x) { return vexp_n<vf, vfi>(x); }

// GELU's tanh form at any vector width (the float GEMM's fused epilogue and encoder_ops' row
// kernel give the same bits): x/2 * (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) * (x +
// 0.044715 x^3).
template <class V, class VI>
[[gnu::always_inline]] inline V gelu_tanh_n(V x) {
  const V u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.f + vexp_n<V, VI>(-2.f * u));
}

}  // namespace llmd::simd
