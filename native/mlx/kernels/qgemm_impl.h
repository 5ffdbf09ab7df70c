// Kernel bodies shared by the per-ISA translation units. Each qgemm_<isa>.cpp defines the
// LLMD_ISA_* macro for its target, includes this file and exports one KernelTable. Compiled
// with that file's own -m flags only, so the build never needs -march=native.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "../../core/fp16.h"
#include "../../core/iq4_nl.h"
#include "../../core/legacy_q5.h"
#include "../../core/scratch.h"
#include "qgemm.h"

#if defined(LLMD_ISA_X86)
#include <immintrin.h>
#elif defined(LLMD_ISA_NEON)
#include <arm_neon.h>
#endif

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

constexpr int kRowTile = 4;     // activation rows sharing one unpacked weight block
constexpr int kRowChunk = 32;   // activation rows kept hot in cache while sweeping columns

// ------------------------------------------------------------------ activation quantization

inline void quantize_row(const float* x, ActBlock* out, int k) {
  for (int b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      out[b].q[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

// Per 256 (qgemm.h, uses_superblock_activations): one scale d = amax / 127 over the super-block,
// then each 32-wide block rounded as quantize_row rounds it, with that shared scale.
inline void quantize_row_k(const float* x, ActBlock* out, int k) {
  constexpr int kPer = 256 / kBlock;
  for (int sb = 0; sb < k / 256; ++sb) {
    const float* xs = x + sb * 256;
    float amax = 0.f;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(xs[i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    for (int b = 0; b < kPer; ++b) {
      ActBlock& o = out[sb * kPer + b];
      int sum = 0;
      for (int i = 0; i < kBlock; ++i) {
        const int q = static_cast<int>(std::nearbyint(xs[b * kBlock + i] * id));
        o.q[i] = static_cast<int8_t>(q);
        sum += q;
      }
      o.d = d;
      o.s = d * static_cast<float>(sum);
    }
  }
}

// ------------------------------------------------------------------ per-block integer dots

#if defined(LLMD_ISA_X86)

// One packed Q8_0 tile (pack8.h, kDword): 8 fp16 d, then 8 rows x 32 int8. IQ4_NL's AVX2 prefill
// expands its tiles into this form (kquant_avx2_tiles.h).
constexpr int kQ8TileBytes = 16 + 8 * 32;

inline float half(const uint8_t* p) { return _cvtsh_ss(read_u16(p)); }

// quantize_row with AVX2: the same operations per element (|x| max, x * (1 / d) rounded to
// nearest-even by cvtps under the default MXCSR mode, exact integer sum), so the blocks are
// bit-identical to the portable version's.
// The largest |x| of n floats (n a multiple of 8): exact in any order.
inline float amax_simd(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// One 32-wide block with scale d (id = 1 / d or 0): x * id rounded to nearest-even by cvtps
// under the default MXCSR mode, exact integer sum, as the portable loops do.
inline void quantize_block_simd(const float* xb, float d, float id, ActBlock& out) {
  const __m256 idv = _mm256_set1_ps(id);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), idv));
  // int32 -> int8 in element order (packs interleave 128-bit lanes; the permute undoes it).
  const __m256i q16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
  const __m256i q16b = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8);
  const __m256i q8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(q16, q16b), 0xd8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q), q8);
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  out.d = d;
  out.s = d * static_cast<float>(_mm_cvtsi128_si32(s4));
}

// quantize_row with AVX2: the same operations per element, so the blocks are bit-identical to
// the portable version's.
inline void quantize_row_simd(const float* x, ActBlock* out, int k) {
  for (int b = 0; b < k / kBlock; ++b) {
    const float d = amax_simd(x + b * kBlock, kBlock) / 127.f;
    quantize_block_simd(x + b * kBlock, d, d > 0.f ? 1.f / d : 0.f, out[b]);
  }
}

// quantize_row_k with AVX2, bit-identical to it.
inline void quantize_row_k_simd(const float* x, ActBlock* out, int k) {
  constexpr int kPer = 256 / kBlock;
  for (int sb = 0; sb < k / 256; ++sb) {
    const float d = amax_simd(x + sb * 256, 256) / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    for (int b = 0; b < kPer; ++b) quantize_block_simd(x + sb * 256 + b * kBlock, d, id, out[sb * kPer + b]);
  }
}

inline __m256i isum_u8s8(__m256i w_u8, __m256i a_s8) {
#if defined(LLMD_ISA_VNNI)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_u8, a_s8);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w_u8, a_s8), _mm256_set1_epi16(1));
#endif
}

inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// 0x10 in byte i where bit i of `bits` is set: a Q5_0 / Q5_1 block's fifth bits as code
// increments (byte i of unpack_nibbles is code i).
inline __m256i fifth_bit_bytes(uint32_t bits) {
#if defined(LLMD_ISA_VNNI)
  return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10));
#else
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                              2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select), _mm256_set1_epi8(0x10));
#endif
}

// Bit `bit` of every byte as 0x10 (the packed Q5 tile's fifth-bit planes, pack8.h). A 16-bit
// shift moves no other byte's bit onto bit 4: left by at most 4, right by at most 3.
inline __m256i fifth_bit_plane(__m256i bits, int bit) {
  const __m256i v = bit <= 4 ? _mm256_slli_epi16(bits, 4 - bit) : _mm256_srli_epi16(bits, bit - 4);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Q4_0 / Q4_1: weight = d * q + m with q in [0, 15] (Q4_0: m = -8 d). With kFive, Q5_0 / Q5_1:
// q in [0, 31], the fifth bit from the block's qh (Q5_0: m = -16 d).
template <int R, bool kHasMin, bool kFive = false>
inline void dot_q4(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  constexpr int kBytes = kFive ? q5_block_bytes(kHasMin) : kHasMin ? 20 : 18;
  constexpr int kQs = kFive ? q5_qs_offset(kHasMin) : kHasMin ? 4 : 2;
  __m256 acc[R];
  float accm[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    accm[r] = 0.f;
  }
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const float d = half(blk);
    const float m = kHasMin ? half(blk + 2) : (kFive ? -16.f : -8.f) * d;
    __m256i wq = unpack_nibbles(blk + kQs);
    if constexpr (kFive) wq = _mm256_or_si256(wq, fifth_bit_bytes(q5_fifth_bits(blk, kHasMin)));
    for (int r = 0; r < R; ++r) {
      const ActBlock& ab = a[r][b];
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.q));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum_u8s8(wq, aq)), _mm256_set1_ps(d * ab.d),
                               acc[r]);
      accm[r] += m * ab.s;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + accm[r];
}

// Q8_0 and IQ4_NL: weight = d * w with w a signed byte (Q8_0's own; IQ4_NL's level, looked up
// from its code with vpshufb); the sign trick makes the weight operand unsigned. `weights(blk)`
// gives a block's 32 signed bytes.
template <int R, int kBytes, class Weights>
inline void dot_signed8(const uint8_t* w, const ActBlock* const* a, int nb, float* out, Weights weights) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const float d = half(blk);
    const __m256i wq = weights(blk);
    const __m256i wabs = _mm256_sign_epi8(wq, wq);
    for (int r = 0; r < R; ++r) {
      const ActBlock& ab = a[r][b];
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.q));
      const __m256i as = _mm256_sign_epi8(aq, wq);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum_u8s8(wabs, as)), _mm256_set1_ps(d * ab.d),
                               acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <int R>
inline void dot_q8(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  dot_signed8<R, 34>(w, a, nb, out,
                     [](const uint8_t* blk) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)); });
}

// IQ4_NL's 16 levels in both 128-bit halves, for vpshufb: signed (kIq4nlValues) or offset by 128.
inline __m256i iq4nl_levels(bool offset) {
  const void* p = offset ? static_cast<const void*>(kIq4nlValuesU8) : static_cast<const void*>(kIq4nlValues);
  return _mm256_broadcastsi128_si256(_mm_load_si128(static_cast<const __m128i*>(p)));
}

template <int R>
inline void dot_iq4nl(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  const __m256i levels = iq4nl_levels(false);
  dot_signed8<R, kIq4nlBlockBytes>(
      w, a, nb, out, [levels](const uint8_t* blk) { return _mm256_shuffle_epi8(levels, unpack_nibbles(blk + 2)); });
}

// ------------------------------------------------------------------ 8-row packed layout (pack8.h)
//
// One call computes 8 output columns (a packed group) for R activation rows. Lane c of every
// vector belongs to output column c. For each block the integer dot is exact (no saturation,
// see below), then acc = fma(isum * 1, d_w * d_a, acc) and, for the minimum term,
// acc = fma(m_w, s_a, acc): the same operations in the same order for every R.

constexpr int kPrefetchBlocks = 8;

// An int32 add the compiler keeps where it is written. GCC expands _mm256_add_epi32 into generic
// vector arithmetic, which its reassociation pass regrouped into a tree over all of a block's
// products in the multi-row kernels (every vpmaddwd result of a block live at once: spilled to
// the stack). The empty asm makes the sum opaque, so a chain keeps its order and one register;
// integer sums are exact, so the result is the same either way.
inline __m256i add32_chain(__m256i acc, __m256i v) {
  __m256i r = _mm256_add_epi32(acc, v);
  asm("" : "+x"(r));
  return r;
}

// An int16 add the compiler keeps where it is written. The sums never saturate (bounds at each
// kernel), so the saturating add gives the plain sum; GCC expands _mm256_add_epi16 into generic
// vector arithmetic, which its reassociation pass regrouped into a tree over all of a step's
// products: every vpmaddubsw result of a block live at once, spilled to the stack (~2 stack
// references per vpmaddubsw; the Q4_1 4-row tile ran at 23.7 GMAC/s on a Zen 1 core so, 31 in
// order). The saturating add is a builtin it leaves in order. (int32 sums have no saturating
// form: add32_chain above.)
inline __m256i add16_chain(__m256i acc, __m256i p) { return _mm256_adds_epi16(acc, p); }

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// Accumulators of R rows x G groups of 8 output columns.
template <int R, int G>
inline void zero_tiles(__m256 (&acc)[R][G]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
  }
}
template <int R, int G>
inline void store_tiles(const __m256 (&acc)[R][G], float* const* out) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(out[r] + 8 * g, acc[r][g]);
  }
}

// Decode streams each weight byte once from memory: a kernel call that is the first of its
// pass to touch a group's bytes (`stream`: every single-row call, and the first row tile of a
// row chunk) asks for the tile blocks ahead so its loads do not wait on DRAM. The later row
// tiles of the chunk find the group in cache and skip the prefetches (18 per Q4_K super-block
// per tile: asking on every tile cost a 1B Q4_K_M pp512 15%, 195 -> 165 tok/s). Asking on the
// first tile took a 4-sequence decode step on that model from 57 to 42 ms, 8 sequences on
// the 1B Q4_0 model from 83 to 67 ms.
template <int G, int kTile>
inline void prefetch_tiles(const uint8_t* w, size_t stride, int b) {
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const char* t = reinterpret_cast<const char*>(w + g * stride + static_cast<size_t>(b) * kTile);
    for (int off = 0; off < kTile; off += 64) _mm_prefetch(t + off, _MM_HINT_T0);
  }
}

// What a 4-bit code of the packed Q4 tile (pack8.h: Q4_0's and IQ4_NL's 144 bytes, Q4_1's
// 160) stands for: d * (q - 8), d * q + m, or d * kIq4nlValues[q].
// Q5_0 / Q5_1 add a fifth bit to each code (d * (q - 16), d * q + m): their tile is Q4_0's /
// Q4_1's plus 32 bytes of bits (pack8.h).
enum class Code4 { kQ4_0, kQ4_1, kIq4nl, kQ5_0, kQ5_1 };

// R activation rows x G packed groups (8 columns each, `stride` bytes apart): the activation
// broadcasts are shared by the G groups, the unpacked weights by the R rows.
// IQ4_NL's levels come from a vpshufb of the nibbles. With VNNI they are looked up offset by
// 128 (1 .. 241, vpdpbusd's unsigned operand) and the offset is a float term, as Q4_0's -8 is;
// AVX2's vpmaddubsw would saturate on such a pair, so there they are looked up signed and
// multiplied as Q8_0's are (sign trick, every pair widened to int32).
template <int R, int G, Code4 kCode>
inline void dot8_q4(const uint8_t* w, size_t stride, const ActBlock* const* a, int nb, float* const* out,
                   bool stream) {
  constexpr bool kHasMin = kCode == Code4::kQ4_1 || kCode == Code4::kQ5_1;
  constexpr bool kLevels = kCode == Code4::kIq4nl;
  constexpr bool kFive = kCode == Code4::kQ5_0 || kCode == Code4::kQ5_1;
#if defined(LLMD_ISA_VNNI)
  constexpr bool kSigned = false;
  constexpr bool kWiden = false;
#else
  constexpr bool kSigned = kLevels;
  // 5-bit codes: a maddubs pair is at most 2 * 31 * 127 = 7874, so one chunk's int16 lanes
  // (two pairs) fit but four chunks' would not: each chunk is widened to int32.
  constexpr bool kWiden = kSigned || kFive;
#endif
  constexpr int kTile = (kHasMin ? 160 : 144) + (kFive ? 32 : 0);
  constexpr int kQs = kHasMin ? 32 : 16;
  constexpr int kBits = kQs + 128;  // Q5: the fifth-bit planes (pack8.h)
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i levels = iq4nl_levels(!kSigned);
  __m256 acc[R][G];
  zero_tiles(acc);
  for (int b = 0; b < nb; ++b) {
    if (stream) prefetch_tiles<G, kTile>(w, stride, b + kPrefetchBlocks);
    __m256i isum[R][G];
    __m256i planes[G];
    if constexpr (kFive) {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        planes[g] = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w + g * stride + static_cast<size_t>(b) * kTile + kBits));
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < 4; ++h) {
      __m256i lo[G], hi[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const uint8_t* t = w + g * stride + static_cast<size_t>(b) * kTile;
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + kQs + 32 * h));
        lo[g] = _mm256_and_si256(p, mask);
        hi[g] = _mm256_and_si256(_mm256_srli_epi16(p, 4), mask);
        if constexpr (kLevels) {
          lo[g] = _mm256_shuffle_epi8(levels, lo[g]);
          hi[g] = _mm256_shuffle_epi8(levels, hi[g]);
        }
        if constexpr (kFive) {
          lo[g] = _mm256_or_si256(lo[g], fifth_bit_plane(planes[g], 2 * h));
          hi[g] = _mm256_or_si256(hi[g], fifth_bit_plane(planes[g], 2 * h + 1));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int8_t* q = a[r][b].q;
        const __m256i alo = broadcast4(q + 4 * h);
        const __m256i ahi = broadcast4(q + 16 + 4 * h);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
#if defined(LLMD_ISA_VNNI)
          const __m256i base = h == 0 ? _mm256_setzero_si256() : isum[r][g];
          isum[r][g] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(base, lo[g], alo), hi[g], ahi);
#else
          if constexpr (kSigned) {
            // |w| <= 127, |a| <= 127: a maddubs pair is at most 32258 (no saturation), but two
            // such sums do not fit int16, so each is widened first.
            const __m256i one16 = _mm256_set1_epi16(1);
            const __m256i plo = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(lo[g], lo[g]), _mm256_sign_epi8(alo, lo[g])), one16);
            const __m256i phi = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(hi[g], hi[g]), _mm256_sign_epi8(ahi, hi[g])), one16);
            const __m256i p32 = _mm256_add_epi32(plo, phi);
            isum[r][g] = h == 0 ? p32 : add32_chain(isum[r][g], p32);
          } else {
            // int16 lanes: each maddubs term is at most 2 * 15 * 127 = 3810 in magnitude and a
            // lane sums 8 of them (30480 < 32767), so nothing saturates.
            const __m256i s16 =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo[g], alo), _mm256_maddubs_epi16(hi[g], ahi));
            if constexpr (kFive) {
              const __m256i p32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
              isum[r][g] = h == 0 ? p32 : add32_chain(isum[r][g], p32);
            } else {
              isum[r][g] = h == 0 ? s16 : add16_chain(isum[r][g], s16);
            }
          }
#endif
        }
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const uint8_t* t = w + g * stride + static_cast<size_t>(b) * kTile;
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
      constexpr float kOffset = kLevels ? -128.f : kFive ? -16.f : -8.f;
      const __m256 mw = kHasMin ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)))
                                : _mm256_mul_ps(dw, _mm256_set1_ps(kOffset));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const ActBlock& ab = a[r][b];
#if defined(LLMD_ISA_VNNI)
        const __m256i i32 = isum[r][g];
#else
        const __m256i i32 = kWiden ? isum[r][g] : _mm256_madd_epi16(isum[r][g], _mm256_set1_epi16(1));
#endif
        acc[r][g] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(ab.d)), acc[r][g]);
        if constexpr (!kSigned) acc[r][g] = _mm256_fmadd_ps(mw, _mm256_set1_ps(ab.s), acc[r][g]);
      }
    }
  }
  store_tiles(acc, out);
}

template <int R, int G>
inline void dot8_q8(const uint8_t* w, size_t stride, const ActBlock* const* a, int nb, float* const* out,
                   bool stream) {
  constexpr int kTile = kQ8TileBytes;
  __m256 acc[R][G];
  zero_tiles(acc);
  for (int b = 0; b < nb; ++b) {
    if (stream) prefetch_tiles<G, kTile>(w, stride, b + kPrefetchBlocks);
    __m256i isum[R][G];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) isum[r][g] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m256i wq[G], wabs[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const uint8_t* t = w + g * stride + static_cast<size_t>(b) * kTile;
        wq[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 16 + 32 * j));
        wabs[g] = _mm256_sign_epi8(wq[g], wq[g]);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i aq = broadcast4(a[r][b].q + 4 * j);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          // |w| <= 128, |a| <= 127: a pair sums to at most 32512, so maddubs never saturates.
          const __m256i as = _mm256_sign_epi8(aq, wq[g]);
#if defined(LLMD_ISA_VNNI)
          isum[r][g] = _mm256_dpbusd_epi32(isum[r][g], wabs[g], as);
#else
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[g], as), _mm256_set1_epi16(1));
          isum[r][g] = add32_chain(isum[r][g], p);
#endif
        }
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const uint8_t* t = w + g * stride + static_cast<size_t>(b) * kTile;
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][g]), _mm256_mul_ps(dw, _mm256_set1_ps(a[r][b].d)),
                                    acc[r][g]);
      }
    }
  }
  store_tiles(acc, out);
}

// What a packed kernel gets for each activation row: by default the row's blocks. A kernel
// whose Rows type precomputes more per row (Q6_K's half-block sums) gets that instead; the
// driver builds it once per call.
struct PlainRows {
  using Row = const ActBlock*;
  const ActBlock* a;
  int nb;
  PlainRows(const ActBlock* a_, int /*rows*/, int nb_) : a(a_), nb(nb_) {}
  Row row(int r) const { return a + static_cast<size_t>(r) * nb; }
};

#if defined(LLMD_ISA_VNNI)
constexpr int kPlainRowTile = 8;
#else
constexpr int kPlainRowTile = 4;
#endif

// A single row streams one group at a time, as the K-quants do: the AVX2 path's 1B Q4_0
// decode matvecs (one thread, 2 MiB pages, a throwaway harness) read 25.2 GB/s two groups at a
// time and 31.7 one at a time (four: 27.4; a plain read: 40.7). On a Zen 1 core
// (`bench/kquant_kernel_bench.cpp`, 1 row, two processes at once) Q4_1 went 9.7-10.0 -> 14.7-15.0
// GMAC/s and Q8_0 7.4-7.5 -> 8.3-8.6 that way. The same operations per output either way, so
// results are unchanged.
constexpr int kPlainSingleRowGroups = 1;

// The 4-bit tiles (Q4_0, Q4_1, IQ4_NL): dot8_q4 with what a code stands for.
template <Code4 kCode>
struct Dot8Q4 {
  template <int R, int G>
  struct Tile {
    static constexpr int kSingleRowGroups = kPlainSingleRowGroups;
    static constexpr int kRowTile = kPlainRowTile;
    using Rows = PlainRows;
    static void run(const uint8_t* w, size_t stride, const ActBlock* const* a, int nb, float* const* out,
                    bool stream) {
      dot8_q4<R, G, kCode>(w, stride, a, nb, out, stream);
    }
  };
};
template <int R, int G>
struct Dot8Q8_0 {
  static constexpr int kSingleRowGroups = kPlainSingleRowGroups;
  static constexpr int kRowTile = kPlainRowTile;
  using Rows = PlainRows;
  static void run(const uint8_t* w, size_t stride, const ActBlock* const* a, int nb, float* const* out,
                  bool stream) {
    dot8_q8<R, G>(w, stride, a, nb, out, stream);
  }
};

// Groups a single row takes at a time: 2 by default; a kernel may ask for another count (the
// K-quants stream best one group at a time, see kquant_impl.h).
template <template <int, int> class Dot8>
constexpr int single_row_groups() {
  if constexpr (requires { Dot8<1, 1>::kSingleRowGroups; }) {
    return Dot8<1, 1>::kSingleRowGroups;
  } else {
    return 2;
  }
}

// Activation rows one packed tile takes (they share each unpacked weight block): kRowTile by
// default; a kernel may ask for more. Q4_0/Q4_1/Q8_0 take 8 with AVX-512VL's 32 vector
// registers (8 accumulators and 8 integer sums fit beside the weights; with AVX2's 16 they
// would spill), which reads every unpacked weight block once for a whole 8-sequence step.
template <template <int, int> class Dot8>
constexpr int packed_row_tile() {
  if constexpr (requires { Dot8<1, 1>::kRowTile; }) {
    return Dot8<1, 1>::kRowTile;
  } else {
    return kRowTile;
  }
}

// One tile of `n` (1 .. kMax) rows over one group, as a call with a compile-time row count
// (only the counts a kernel's tile can leave are instantiated).
template <template <int, int> class Dot8, int kMax, class Row>
inline void run_row_tile(int n, const uint8_t* group, size_t stride, const Row* rows_a, int nb, float* const* outs,
                         bool stream) {
  if constexpr (kMax > 1) {
    if (n < kMax) return run_row_tile<Dot8, kMax - 1>(n, group, stride, rows_a, nb, outs, stream);
  }
  Dot8<kMax, 1>::run(group, stride, rows_a, nb, outs, stream);
}

// Activation rows of a packed chunk: as many as keep the chunk's activations (KqPair: 1.5 bytes
// per element) within ~384 KiB, about a third of a Zen 4/5 core's L2, 32 to 128. The weights of
// a large product do not fit in L2 and come from L3 once per chunk, so a 512-token prefill
// streams them 4 times instead of 16 where k = 2048 (a 512 x 16384 x 2048 product on one Zen 5
// core: Q5_K 171 -> 220 GMAC/s, Q4_0 262 -> 295); k = 8192 keeps 32 (larger chunks spill L2 and
// measured no faster). The chunk only orders the loops: no output's operations change.
inline int packed_row_chunk(int k) {
  int chunk = kRowChunk;
  while (chunk < 128 && static_cast<size_t>(2 * chunk) * k * 3 / 2 <= (384u << 10)) chunk *= 2;
  return chunk;
}

// Packed groups of 8 weight rows: [n0, n1) must be multiples of 8. Every group is swept once
// per chunk of rows, in tiles of packed_row_tile() rows plus one tile of the rows left over
// (a 6-sequence step is a 4-row and a 2-row tile over each group in one pass, not a tile and
// two more passes over the whole matrix). A single row (a lone sequence's decode step) takes
// single_row_groups() groups at a time. Every tile shape runs the same per-lane operations,
// so an output does not depend on the tile it fell in.
template <template <int, int> class Dot8>
inline void gemm_packed(const uint8_t* w, size_t w_row_bytes, const ActBlock* a, int k, int rows, int n0, int n1,
                        float* out, int ldo) {
  using Rows = typename Dot8<1, 1>::Rows;
  using Row = typename Rows::Row;
  constexpr int kTile = packed_row_tile<Dot8>();
  static_assert(kTile >= 1 && kTile <= 8);
  const int nb = k / kBlock;
  const size_t stride = 8 * w_row_bytes;
  const Rows act(a, rows, nb);
  if (rows == 1) {
    const Row row_a = act.row(0);
    constexpr int kG = single_row_groups<Dot8>();
    int n = n0;
    for (; n + 8 * kG <= n1; n += 8 * kG) {
      float* o = out + n;
      Dot8<1, kG>::run(w + static_cast<size_t>(n) * w_row_bytes, stride, &row_a, nb, &o, true);
    }
    for (; n < n1; n += 8) {
      float* o = out + n;
      Dot8<1, 1>::run(w + static_cast<size_t>(n) * w_row_bytes, stride, &row_a, nb, &o, true);
    }
    return;
  }
  const int chunk = packed_row_chunk(k);
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int r1 = std::min(rows, r0 + chunk);
    for (int n = n0; n < n1; n += 8) {
      const uint8_t* group = w + static_cast<size_t>(n) * w_row_bytes;
      for (int r = r0; r < r1; r += kTile) {
        const int t_rows = std::min(kTile, r1 - r);
        Row rows_a[kTile];
        float* outs[kTile];
        for (int t = 0; t < t_rows; ++t) {
          rows_a[t] = act.row(r + t);
          outs[t] = out + static_cast<size_t>(r + t) * ldo + n;
        }
        run_row_tile<Dot8, kTile>(t_rows, group, stride, rows_a, nb, outs, r == r0);
      }
    }
  }
}

// The packed kernels of the 4-bit codes (and Q5's, with their fifth bit) and of Q8_0.
inline constexpr GemmFn gemm_q4_0_x8 = gemm_packed<Dot8Q4<Code4::kQ4_0>::Tile>;
inline constexpr GemmFn gemm_q4_1_x8 = gemm_packed<Dot8Q4<Code4::kQ4_1>::Tile>;
inline constexpr GemmFn gemm_q8_0_x8 = gemm_packed<Dot8Q8_0>;
inline constexpr GemmFn gemm_iq4_nl_x8 = gemm_packed<Dot8Q4<Code4::kIq4nl>::Tile>;
inline constexpr GemmFn gemm_q5_0_x8 = gemm_packed<Dot8Q4<Code4::kQ5_0>::Tile>;
inline constexpr GemmFn gemm_q5_1_x8 = gemm_packed<Dot8Q4<Code4::kQ5_1>::Tile>;

#elif defined(LLMD_ISA_NEON)

// arm64 (ASIMD is part of the base ISA). Built twice: with -march=armv8.2-a+dotprod (`sdot`,
// __ARM_FEATURE_DOTPROD) and with plain -march=armv8-a (widening multiplies). Both keep one
// float32x4 accumulator per row whose lanes take the block's partial integer sums, like the
// x86 path's 8 lanes; the lanes are summed once at the end.

inline float half(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, sizeof(h));
  return static_cast<float>(h);
}

// Partial sums of w[i] * a[i] over 16 int8 pairs, 4 lanes (exact: the lane split differs
// between the two builds, the total does not).
inline int32x4_t isum_s8(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, w, a);
#else
  // |w * a| <= 128 * 127 fits int16; pairs are widened to int32 before any further sum.
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(a)));
  return vpadalq_s16(acc, vmull_high_s8(w, a));
#endif
}

// 0x10 in byte i where bit i of `bits` is set (Q5_0 / Q5_1's fifth bits, 16 codes at a time).
inline uint8x16_t fifth_bit_bytes(uint32_t bits) {
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)), vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  const uint8x16_t select = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
  return vandq_u8(vtstq_u8(spread, select), vdupq_n_u8(0x10));
}

// Q4_0 / Q4_1: weight = d * q + m with q in [0, 15] (Q4_0: m = -8 d); q fits int8 as is. With
// kFive, Q5_0 / Q5_1: q in [0, 31] with the fifth bit from qh (Q5_0: m = -16 d).
template <int R, bool kHasMin, bool kFive = false>
inline void dot_q4(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  constexpr int kBytes = kFive ? q5_block_bytes(kHasMin) : kHasMin ? 20 : 18;
  constexpr int kQs = kFive ? q5_qs_offset(kHasMin) : kHasMin ? 4 : 2;
  const uint8x16_t mask = vdupq_n_u8(0x0f);
  float32x4_t acc[R];
  float accm[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = vdupq_n_f32(0.f);
    accm[r] = 0.f;
  }
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const float d = half(blk);
    const float m = kHasMin ? half(blk + 2) : (kFive ? -16.f : -8.f) * d;
    const uint8x16_t bytes = vld1q_u8(blk + kQs);
    uint8x16_t lo_u = vandq_u8(bytes, mask);  // elements 0..15
    uint8x16_t hi_u = vshrq_n_u8(bytes, 4);   // elements 16..31
    if constexpr (kFive) {
      const uint32_t qh = q5_fifth_bits(blk, kHasMin);
      lo_u = vorrq_u8(lo_u, fifth_bit_bytes(qh));
      hi_u = vorrq_u8(hi_u, fifth_bit_bytes(qh >> 16));
    }
    const int8x16_t lo = vreinterpretq_s8_u8(lo_u);
    const int8x16_t hi = vreinterpretq_s8_u8(hi_u);
    for (int r = 0; r < R; ++r) {
      const ActBlock& ab = a[r][b];
      int32x4_t isum = isum_s8(vdupq_n_s32(0), lo, vld1q_s8(ab.q));
      isum = isum_s8(isum, hi, vld1q_s8(ab.q + 16));
      acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(isum), d * ab.d);
      accm[r] = std::fma(m, ab.s, accm[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = vaddvq_f32(acc[r]) + accm[r];
}

// Q8_0 and IQ4_NL: weight = d * w with w a signed byte (Q8_0's own; IQ4_NL's level, looked up
// from its code with tbl). `weights(blk)` gives a block's 32 signed bytes (elements 0..15, 16..31).
template <int R, int kBytes, class Weights>
inline void dot_signed8(const uint8_t* w, const ActBlock* const* a, int nb, float* out, Weights weights) {
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.f);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const float d = half(blk);
    const int8x16x2_t wq = weights(blk);
    for (int r = 0; r < R; ++r) {
      const ActBlock& ab = a[r][b];
      int32x4_t isum = isum_s8(vdupq_n_s32(0), wq.val[0], vld1q_s8(ab.q));
      isum = isum_s8(isum, wq.val[1], vld1q_s8(ab.q + 16));
      acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(isum), d * ab.d);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = vaddvq_f32(acc[r]);
}

template <int R>
inline void dot_q8(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  dot_signed8<R, 34>(w, a, nb, out, [](const uint8_t* blk) {
    return int8x16x2_t{{vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2)),
                        vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18))}};
  });
}

template <int R>
inline void dot_iq4nl(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  const int8x16_t levels = vld1q_s8(kIq4nlValues);
  dot_signed8<R, kIq4nlBlockBytes>(w, a, nb, out, [levels](const uint8_t* blk) {
    const uint8x16_t bytes = vld1q_u8(blk + 2);
    return int8x16x2_t{{vqtbl1q_s8(levels, vandq_u8(bytes, vdupq_n_u8(0x0f))), vqtbl1q_s8(levels, vshrq_n_u8(bytes, 4))}};
  });
}

#else  // portable scalar path

inline float half(const uint8_t* p) { return half_to_float(read_u16(p)); }

// Q4_0 / Q4_1 (kFive: Q5_0 / Q5_1, whose codes carry a fifth bit from qh).
template <int R, bool kHasMin, bool kFive = false>
inline void dot_q4(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  constexpr int kBytes = kFive ? q5_block_bytes(kHasMin) : kHasMin ? 20 : 18;
  constexpr int kQs = kFive ? q5_qs_offset(kHasMin) : kHasMin ? 4 : 2;
  float acc[R];
  float accm[R];
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = 0.f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const float d = half(blk);
    const float m = kHasMin ? half(blk + 2) : (kFive ? -16.f : -8.f) * d;
    const uint8_t* qs = blk + kQs;
    const uint32_t qh = kFive ? q5_fifth_bits(blk, kHasMin) : 0;
    for (int r = 0; r < R; ++r) {
      const ActBlock& ab = a[r][b];
      int isum = 0;
      for (int i = 0; i < 16; ++i) {
        const int lo = (qs[i] & 0x0f) | (((qh >> i) & 1) << 4);
        const int hi = (qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
        isum += lo * ab.q[i] + hi * ab.q[i + 16];
      }
      acc[r] += static_cast<float>(isum) * (d * ab.d);
      accm[r] += m * ab.s;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r] + accm[r];
}

// Q8_0 and IQ4_NL: weight = d * w with w a signed byte; `weights(blk, w)` writes a block's 32.
template <int R, int kBytes, class Weights>
inline void dot_signed8(const uint8_t* w, const ActBlock* const* a, int nb, float* out, Weights weights) {
  float acc[R];
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  int8_t wq[kBlock];
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const float d = half(blk);
    weights(blk, wq);
    for (int r = 0; r < R; ++r) {
      const ActBlock& ab = a[r][b];
      int isum = 0;
      for (int i = 0; i < kBlock; ++i) isum += wq[i] * ab.q[i];
      acc[r] += static_cast<float>(isum) * (d * ab.d);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

template <int R>
inline void dot_q8(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  dot_signed8<R, 34>(w, a, nb, out, [](const uint8_t* blk, int8_t* wq) { std::memcpy(wq, blk + 2, kBlock); });
}

template <int R>
inline void dot_iq4nl(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
  dot_signed8<R, kIq4nlBlockBytes>(
      w, a, nb, out, [](const uint8_t* blk, int8_t* wq) { iq4nl_block_levels(blk, kIq4nlValues, wq); });
}

#endif

// ------------------------------------------------------------------ tiled GEMM driver

template <template <int> class Dot>
inline void gemm(const uint8_t* w, size_t w_row_bytes, const ActBlock* a, int k, int rows, int n0,
                 int n1, float* out, int ldo) {
  const int nb = k / kBlock;
  for (int r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int r1 = std::min(rows, r0 + kRowChunk);
    for (int n = n0; n < n1; ++n) {
      const uint8_t* wrow = w + static_cast<size_t>(n) * w_row_bytes;
      int r = r0;
      for (; r + kRowTile <= r1; r += kRowTile) {
        const ActBlock* rows_a[kRowTile];
        float res[kRowTile];
        for (int t = 0; t < kRowTile; ++t) rows_a[t] = a + static_cast<size_t>(r + t) * nb;
        Dot<kRowTile>::run(wrow, rows_a, nb, res);
        for (int t = 0; t < kRowTile; ++t) out[static_cast<size_t>(r + t) * ldo + n] = res[t];
      }
      for (; r < r1; ++r) {
        const ActBlock* row_a = a + static_cast<size_t>(r) * nb;
        float res;
        Dot<1>::run(wrow, &row_a, nb, &res);
        out[static_cast<size_t>(r) * ldo + n] = res;
      }
    }
  }
}

// The row-major dots as gemm's Dot: 4-bit codes (kFive: Q5's), Q8_0, IQ4_NL.
template <bool kHasMin, bool kFive>
struct DotCodes {
  template <int R>
  struct Dot {
    static void run(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
      dot_q4<R, kHasMin, kFive>(w, a, nb, out);
    }
  };
};
template <int R>
struct DotQ8_0 {
  static void run(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
    dot_q8<R>(w, a, nb, out);
  }
};
template <int R>
struct DotIq4nl {
  static void run(const uint8_t* w, const ActBlock* const* a, int nb, float* out) {
    dot_iq4nl<R>(w, a, nb, out);
  }
};

inline constexpr GemmFn gemm_q4_0 = gemm<DotCodes<false, false>::Dot>;
inline constexpr GemmFn gemm_q4_1 = gemm<DotCodes<true, false>::Dot>;
inline constexpr GemmFn gemm_q5_0 = gemm<DotCodes<false, true>::Dot>;
inline constexpr GemmFn gemm_q5_1 = gemm<DotCodes<true, true>::Dot>;
inline constexpr GemmFn gemm_q8_0 = gemm<DotQ8_0>;
inline constexpr GemmFn gemm_iq4_nl = gemm<DotIq4nl>;

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE

#include "kquant_impl.h"
#include "kquant_low_bits.h"
#include "kquant_avx2_tiles.h"
#include "legacy_zmm_impl.h"
#include "kquant_zmm_blocked.h"
#include "kquant_low_bits_prefill.h"

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

inline const KernelTable* make_table(const char* isa) {
#if defined(LLMD_ISA_X86)
  static const KernelTable table{.isa = isa,
                                 .quantize_row = quantize_row_simd,
                                 .quantize_row_k = quantize_row_k_simd,
                                 .q4_0 = gemm_q4_0,
                                 .q4_1 = gemm_q4_1,
                                 .q8_0 = gemm_q8_0,
                                 .q4_k = gemm_q4_k,
                                 .q5_k = gemm_q5_k,
                                 .q6_k = gemm_q6_k,
                                 .iq4_nl = gemm_iq4_nl,
#if defined(LLMD_ISA_VNNI)
                                 .q2_k = gemm_q2_k_blocked,
                                 .q3_k = gemm_q3_k_blocked,
#else
                                 .q2_k = gemm_q2_k_expanded,
                                 .q3_k = gemm_q3_k_expanded,
#endif
                                 .q5_0 = gemm_q5_0,
                                 .q5_1 = gemm_q5_1,
#if defined(LLMD_ISA_VNNI)
                                 .q4_0_x8 = gemm_q4_0_x8_zmm,
                                 .q4_1_x8 = gemm_q4_1_x8_zmm,
                                 .q8_0_x8 = gemm_q8_0_x8_zmm,
#else
                                 .q4_0_x8 = gemm_q4_0_x8,
                                 .q4_1_x8 = gemm_q4_1_x8,
                                 .q8_0_x8 = gemm_q8_0_x8,
#endif
#if defined(LLMD_ISA_VNNI)
                                 .q4_k_x8 = gemm_q4_k_x8_blocked,
                                 .q5_k_x8 = gemm_q5_k_x8_blocked,
                                 .q6_k_x8 = gemm_q6_k_x8_blocked,
                                 .iq4_nl_x8 = gemm_iq4_nl_x8_zmm,
                                 .q5_0_x8 = gemm_q5_0_x8_zmm,
                                 .q5_1_x8 = gemm_q5_1_x8_zmm,
                                 .pack_layout = PackLayout::kQword,
                                 .column_quantum = kKbCols};
#else
                                 .q4_k_x8 = gemm_q4_k_x8_expanded,
                                 .q5_k_x8 = gemm_q5_k_x8_expanded,
                                 .q6_k_x8 = gemm_q6_k_x8_expanded,
                                 .iq4_nl_x8 = gemm_iq4_nl_x8_expanded,
                                 .q5_0_x8 = gemm_q5_0_x8,
                                 .q5_1_x8 = gemm_q5_1_x8,
                                 .pack_layout = PackLayout::kDword};
#endif
#else
  static const KernelTable table{.isa = isa,
                                 .quantize_row = quantize_row,
                                 .quantize_row_k = quantize_row_k,
                                 .q4_0 = gemm_q4_0,
                                 .q4_1 = gemm_q4_1,
                                 .q8_0 = gemm_q8_0,
                                 .q4_k = gemm_q4_k,
                                 .q5_k = gemm_q5_k,
                                 .q6_k = gemm_q6_k,
                                 .iq4_nl = gemm_iq4_nl,
                                 .q2_k = gemm_q2_k,
                                 .q3_k = gemm_q3_k,
                                 .q5_0 = gemm_q5_0,
                                 .q5_1 = gemm_q5_1};
#endif
  return &table;
}

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE
