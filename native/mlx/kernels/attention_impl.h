// The attention kernel body, compiled once per instruction set: attention_<isa>.cpp defines
// LLMD_ATTN_NS (and LLMD_ATTN_F16C where the TU is built with -mf16c) and includes this file;
// attention_kernels.cpp picks the variant that follows the active matmul path, so
// LLMD_CPU_PATH forces attention down with the matmuls and tests can run every variant.
//
// Flash-style: the keys and values are swept in KV tiles of kKvTile positions aligned to
// absolute positions, with an online softmax (running max and sum per query, the accumulator
// rescaled when the max grows). Every query of the tile (up to kMaxTileRows: rows of one
// sequence x heads of one KV group) uses a KV tile while it sits in L1/L2, so a long prompt
// reads its keys and values once per tile of queries instead of once per 4 queries.
//
// Keys and values are read in the pool's element type: float32; float16 or q8_0 / q4_0 blocks
// converted in registers where they are loaded (decode: up to 4 queries read a KV tile), or
// once per KV tile into a float32 copy when more queries share it (prefill). Both conversions
// are exact (a code times its block's float16 scale fits a float), so the two give the same
// bits, and the whole cache is never converted. Each query's arithmetic
// depends only on its own range and the KV: the tiles it visits (fixed by absolute positions),
// the score sum over head_dim, the max, the per-tile exp and sums, the value accumulation over
// positions in order, and the fold of its spans' results in order (kKvSpan: one span per task
// or all in one sweep, the same bits). Queries sharing a micro-tile only widen the range of
// positions a query adds with weight exactly 0 (which changes no value, at most the sign of a
// zero), so a result does not depend on what the query is batched with, nor on whether its
// prompt was prefilled in one chunk, several, or step by step (decode runs this same kernel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../core/fp16.h"
#include "../../core/kv_quant.h"
#include "../attention_kernels.h"
#include "../simd.h"

#if defined(LLMD_ATTN_F16C)
#include <immintrin.h>
#endif

namespace llmd::attention::LLMD_ATTN_NS {

namespace {

using namespace simd;

constexpr int kT = kKvTile;
constexpr int kMicro = 4;  // queries whose scores and accumulators are held together
static_assert(kT % kLanes == 0);

// The sweeps' vector, one register wide: 16 floats (zmm) in the AVX-512 variant, which halves
// the FMA instructions on cores with full-width AVX-512 units; 8 (ymm) in the AVX2 one; 4 in
// the generic one (SSE2 / NEON: GCC keeps a two-register vector on the stack, and there the
// sweeps ran ~30x slower than AVX2). Each lane's arithmetic (a score's sum over head_dim, an
// output's sum over positions, an exp) is the same whatever the width, and the softmax sums
// keep the 8-lane order, so every variant gives the same bits.
#if defined(LLMD_ATTN_WIDE)
constexpr int kW = 16;
using wf = float __attribute__((vector_size(64)));
#elif defined(LLMD_ATTN_F16C)
constexpr int kW = kLanes;
using wf = vf;
#else
constexpr int kW = 4;
using wf = float __attribute__((vector_size(16)));
#endif
using wfi = int __attribute__((vector_size(sizeof(wf))));
constexpr int kChunks = kT / kW;  // kW-position chunks of a KV tile
static_assert(kT % kW == 0);

[[gnu::always_inline]] inline wf wload(const float* p) {
  wf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void wstore(float* p, wf v) { std::memcpy(p, &v, sizeof(v)); }

[[gnu::always_inline]] inline vf load_kv(const float* p) { return load(p); }

[[gnu::always_inline]] inline vf load_kv(const uint16_t* p) {
#if defined(LLMD_ATTN_F16C)
  const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  vf out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
#else
  // Without F16C: place the half's exponent and mantissa in a float's bits and rescale by
  // 2^(127-15), which is exact for normal and subnormal halves alike; infinities and NaNs
  // (exponent 31) get the float's all-ones exponent. Branch-free, so it vectorises.
  uint16_t h[kLanes];
  std::memcpy(h, p, sizeof(h));
  vfi bits;
  for (int i = 0; i < kLanes; ++i) bits[i] = h[i];
  const vfi sign = (bits & 0x8000) << 16;
  const vfi em = bits & 0x7fff;
  vf mag;
  const vfi shifted = em << 13;
  std::memcpy(&mag, &shifted, sizeof(mag));
  mag *= 0x1p112f;
  vfi out_bits;
  std::memcpy(&out_bits, &mag, sizeof(out_bits));
  out_bits = em >= 0x7c00 ? (shifted | 0x7f800000) : out_bits;
  out_bits |= sign;
  vf out;
  std::memcpy(&out, &out_bits, sizeof(out));
  return out;
#endif
}

// kW keys or values from p, as floats.
[[gnu::always_inline]] inline wf wload_kv(const float* p) { return wload(p); }

[[gnu::always_inline]] inline wf wload_kv(const uint16_t* p) {
#if defined(LLMD_ATTN_WIDE)
  const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  wf out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
#elif defined(LLMD_ATTN_F16C)
  return load_kv(p);
#else
  // load_kv's exact conversion, 4 lanes.
  uint16_t h[kW];
  std::memcpy(h, p, sizeof(h));
  wfi bits;
  for (int i = 0; i < kW; ++i) bits[i] = h[i];
  const wfi sign = (bits & 0x8000) << 16;
  const wfi em = bits & 0x7fff;
  const wfi shifted = em << 13;
  wf mag;
  std::memcpy(&mag, &shifted, sizeof(mag));
  mag *= 0x1p112f;
  wfi out_bits;
  std::memcpy(&out_bits, &mag, sizeof(out_bits));
  out_bits = em >= 0x7c00 ? (shifted | 0x7f800000) : out_bits;
  out_bits |= sign;
  wf out;
  std::memcpy(&out, &out_bits, sizeof(out));
  return out;
#endif
}

// Chunks per sweep for R queries: R * C accumulators fill most of the vector registers (16 on
// AVX2 and SSE, 32 with AVX-512's EVEX encodings) with the most independent chains.
constexpr int sweep_chunks(int r) {
#if defined(LLMD_ATTN_WIDE)
  constexpr int kAccumulators = 16;
#else
  constexpr int kAccumulators = 8;
#endif
  const int c = kAccumulators / r;
  return c >= kChunks ? kChunks : c >= 4 ? 4 : c >= 2 ? 2 : 1;
}

// Ask for `bytes` from p (one line per 64 bytes).
template <class E>
[[gnu::always_inline]] inline void prefetch_span(const E* p, int bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch(c + b);
}

// Quantized KV (kv_quant.h's layout): for a tile of many queries, attend_tile<Q8> / <Q4>
// dequantize each KV tile into the float32 tile buffer (keys [head_dim][kT], values
// [kT][head_dim]) once, then every micro-tile reads floats from L1/L2 as for a converted float16
// tile; a small tile reads the codes in registers (QuantKvTile). Dequantization is exact (q * d
// fits a float), so the scores are those of float32 attention over the dequantized numbers.
struct Q8 {};
struct Q4 {};
template <class E>
constexpr bool kQuantized = std::is_same_v<E, Q8> || std::is_same_v<E, Q4>;

using vb8 = int8_t __attribute__((vector_size(8)));
using vu8 = uint8_t __attribute__((vector_size(8)));

[[gnu::always_inline]] inline vf bytes_to_floats(vb8 b) { return __builtin_convertvector(b, vf); }

// Keys of positions off .. off + kT - 1 of one head's key part, times their scales, into
// k32[d * kT + j]; `next` (or null): the following tile's part, requested meanwhile.
template <class E>
void dequantize_keys(const uint8_t* part, int off, int head_dim, int block_tokens, const uint8_t* next, float* k32) {
  constexpr KvType type = std::is_same_v<E, Q8> ? KvType::Q8_0 : KvType::Q4_0;
  const size_t plane = kv_quant::plane_bytes(type, head_dim, block_tokens);
  const auto* scales = reinterpret_cast<const uint16_t*>(part + plane);
  for (int b = 0; b < head_dim / kv_quant::kBlock; ++b) {
    alignas(32) float sc[kT];
    for (int j = 0; j < kT; j += kLanes) store(sc + j, load_kv(scales + static_cast<size_t>(b) * block_tokens + off + j));
    if constexpr (std::is_same_v<E, Q8>) {
      for (int d = b * kv_quant::kBlock; d < (b + 1) * kv_quant::kBlock; ++d) {
        const uint8_t* row = part + static_cast<size_t>(d) * block_tokens + off;
        if (next) __builtin_prefetch(next + static_cast<size_t>(d) * block_tokens + off);
        for (int j = 0; j < kT; j += kLanes) {
          vb8 q;
          std::memcpy(&q, row + j, sizeof(q));
          store(k32 + static_cast<size_t>(d) * kT + j, bytes_to_floats(q) * load(sc + j));
        }
      }
    } else {
      for (int i = 0; i < kv_quant::kBlock / 2; ++i) {
        const int r = b * kv_quant::kBlock / 2 + i;
        const int d = b * kv_quant::kBlock + i;
        const uint8_t* row = part + static_cast<size_t>(r) * block_tokens + off;
        if (next) __builtin_prefetch(next + static_cast<size_t>(r) * block_tokens + off);
        for (int j = 0; j < kT; j += kLanes) {
          vu8 q;
          std::memcpy(&q, row + j, sizeof(q));
          const vb8 lo = (vb8)(q & 15) - 8;
          const vb8 hi = (vb8)(q >> 4) - 8;
          store(k32 + static_cast<size_t>(d) * kT + j, bytes_to_floats(lo) * load(sc + j));
          store(k32 + static_cast<size_t>(d + kv_quant::kBlock / 2) * kT + j, bytes_to_floats(hi) * load(sc + j));
        }
      }
    }
  }
  if (next) {
    const auto* ns = next + plane;
    for (int b = 0; b < head_dim / kv_quant::kBlock; ++b) prefetch_span(ns + (static_cast<size_t>(b) * block_tokens + off) * 2, kT * 2);
  }
}

// Values of positions off .. off + kT - 1 of one head's value part into v32[j * head_dim + d].
template <class E>
void dequantize_values(const uint8_t* part, int off, int head_dim, int block_tokens, const uint8_t* next,
                       float* v32) {
  constexpr KvType type = std::is_same_v<E, Q8> ? KvType::Q8_0 : KvType::Q4_0;
  constexpr int kB = kv_quant::kBlock;
  const size_t plane = kv_quant::plane_bytes(type, head_dim, block_tokens);
  const int row_bytes = std::is_same_v<E, Q8> ? head_dim : head_dim / 2;
  const int blocks = head_dim / kB;
  const auto* scales = reinterpret_cast<const uint16_t*>(part + plane) + static_cast<size_t>(off) * blocks;
  if (next) {
    prefetch_span(next + static_cast<size_t>(off) * row_bytes, kT * row_bytes);
    prefetch_span(next + plane + static_cast<size_t>(off) * blocks * 2, kT * blocks * 2);
  }
  for (int j = 0; j < kT; ++j) {
    const uint8_t* row = part + static_cast<size_t>(off + j) * row_bytes;
    float* out = v32 + static_cast<size_t>(j) * head_dim;
    for (int b = 0; b < blocks; ++b) {
      const vf d = splat(half_to_float(scales[static_cast<size_t>(j) * blocks + b]));
      if constexpr (std::is_same_v<E, Q8>) {
        for (int c = 0; c < kB; c += kLanes) {
          vb8 q;
          std::memcpy(&q, row + b * kB + c, sizeof(q));
          store(out + b * kB + c, bytes_to_floats(q) * d);
        }
      } else {
        for (int c = 0; c < kB / 2; c += kLanes) {
          vu8 q;
          std::memcpy(&q, row + b * kB / 2 + c, sizeof(q));
          store(out + b * kB + c, bytes_to_floats((vb8)(q & 15) - 8) * d);
          store(out + b * kB + kB / 2 + c, bytes_to_floats((vb8)(q >> 4) - 8) * d);
        }
      }
    }
  }
}

// One KV tile as a micro-tile reads it: keys [head_dim][kstride] (positions along a row),
// values [kT][head_dim]; `next_*` (or null) is the following tile, requested while this one
// computes (decode reads each key once per step, mostly from DRAM).
template <class E>
struct KvTile {
  const E* k;
  int kstride;
  const E* v;
  const E* next_k;
  int next_kstride;
  const E* next_v;
  int head_dim;

  // Keys of positions p .. p + kW - 1 along dim d; values of dims c .. c + kW - 1 of position j.
  [[gnu::always_inline]] wf key(int d, int p) const { return wload_kv(k + static_cast<size_t>(d) * kstride + p); }
  [[gnu::always_inline]] wf value(int j, int c) const { return wload_kv(v + static_cast<size_t>(j) * head_dim + c); }
  [[gnu::always_inline]] void prefetch_key(int d) const {
    prefetch_span(next_k + static_cast<size_t>(d) * next_kstride, kT * sizeof(E));
  }
  [[gnu::always_inline]] void prefetch_value(int j) const {
    prefetch_span(next_v + static_cast<size_t>(j) * head_dim, head_dim * sizeof(E));
  }
};

// kW signed bytes as floats; kW 4-bit codes (bits `shift` .. shift + 3 of kW bytes) minus 8.
[[gnu::always_inline]] inline wf s8_to_floats(const uint8_t* p) {
#if defined(LLMD_ATTN_WIDE)
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(LLMD_ATTN_F16C)
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  using vb = int8_t __attribute__((vector_size(kW)));
  vb b;
  std::memcpy(&b, p, sizeof(b));
  const wf v = __builtin_convertvector(b, wf);
#endif
  wf out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

[[gnu::always_inline]] inline wf u4_to_floats(const uint8_t* p, int shift) {
#if defined(LLMD_ATTN_WIDE)
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i q = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(15)),
                                     _mm512_set1_epi32(8));
  const __m512 v = _mm512_cvtepi32_ps(q);
#elif defined(LLMD_ATTN_F16C)
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(b, shift), _mm256_set1_epi32(15)),
                                     _mm256_set1_epi32(8));
  const __m256 v = _mm256_cvtepi32_ps(q);
#else
  using vb = int8_t __attribute__((vector_size(kW)));
  using vu = uint8_t __attribute__((vector_size(kW)));
  vu b;
  std::memcpy(&b, p, sizeof(b));
  const wf v = __builtin_convertvector((vb)((b >> shift) & 15) - 8, wf);
#endif
  wf out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

// A q8_0 / q4_0 tile read in registers (decode: one row's queries read each number once, so a
// float32 copy of the tile would cost more than it saves). A key or value is its code times its
// block's scale, a product float32 holds exactly: the same floats, hence the same scores and
// sums, as a dequantized copy gives (dequantize_keys / dequantize_values). The scales of the
// tile's positions are converted once per tile: kscale [head_dim / 32][kT], vscale [kT][head_dim / 32].
template <class E>
struct QuantKvTile {
  static constexpr bool kQ8 = std::is_same_v<E, Q8>;
  const uint8_t* k;  // the key plane at the tile's first position (row stride kstride)
  int kstride;
  const float* kscale;
  const uint8_t* v;  // the value codes of the tile's first position
  const float* vscale;
  const uint8_t* next_k;  // the following tile's key part and value codes (or null)
  const uint8_t* next_v;
  int head_dim;

  [[gnu::always_inline]] wf key(int d, int p) const {
    const int b = d / kv_quant::kBlock;
    const wf sc = wload(kscale + b * kT + p);
    if constexpr (kQ8) return s8_to_floats(k + static_cast<size_t>(d) * kstride + p) * sc;
    const int i = d % kv_quant::kBlock;
    const int row = b * kv_quant::kBlock / 2 + i % (kv_quant::kBlock / 2);
    return u4_to_floats(k + static_cast<size_t>(row) * kstride + p, i < kv_quant::kBlock / 2 ? 0 : 4) * sc;
  }
  [[gnu::always_inline]] wf value(int j, int c) const {
    const int blocks = head_dim / kv_quant::kBlock;
    const int b = c / kv_quant::kBlock;
    const float sc = vscale[j * blocks + b];
    if constexpr (kQ8) return s8_to_floats(v + static_cast<size_t>(j) * head_dim + c) * sc;
    const int i = c % kv_quant::kBlock;
    const uint8_t* row = v + static_cast<size_t>(j) * (head_dim / 2) + b * kv_quant::kBlock / 2;
    return u4_to_floats(row + i % (kv_quant::kBlock / 2), i < kv_quant::kBlock / 2 ? 0 : 4) * sc;
  }
  [[gnu::always_inline]] void prefetch_key(int d) const {
    if (kQ8 || d % kv_quant::kBlock < kv_quant::kBlock / 2) {
      const int b = d / kv_quant::kBlock, i = d % kv_quant::kBlock;
      const int row = kQ8 ? d : b * kv_quant::kBlock / 2 + i;
      prefetch_span(next_k + static_cast<size_t>(row) * kstride, kT);
    }
  }
  [[gnu::always_inline]] void prefetch_value(int j) const {
    prefetch_span(next_v + static_cast<size_t>(j) * head_dim / (kQ8 ? 1 : 2), head_dim / (kQ8 ? 1 : 2));
  }
};

// Scores of R queries over C consecutive chunks starting at chunk c0 of the tile. Each score is
// the same sum over head_dim in the same order whatever R and C (their accumulators are
// independent; more chunks per sweep only shortens the FMA chains of small tiles).
template <int R, int C, class Tile>
[[gnu::always_inline]] inline void score_sweep(const float* const* q, const Tile& kv, int head_dim, int c0,
                                               bool prefetch, float (*s)[kT]) {
  wf acc[R][C] = {};
  for (int d = 0; d < head_dim; ++d) {
    if (prefetch) kv.prefetch_key(d);
    for (int c = 0; c < C; ++c) {
      const wf kk = kv.key(d, kW * (c0 + c));
      for (int r = 0; r < R; ++r) acc[r][c] += q[r][d] * kk;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) wstore(s[r] + kW * (c0 + c), acc[r][c]);
  }
}

// acc[c0 ..] = acc * alpha + sum_j p_j * V[j][c0 ..] for R queries, positions j0 .. j1 - 1 in
// order (a query's weights outside its own range are exactly 0).
template <int R, int C, class Tile>
[[gnu::always_inline]] inline void value_sweep(float* const* out, const float* alpha, const Tile& kv, int j0, int j1,
                                               int c0, bool prefetch, const float (*p)[kT]) {
  wf acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = wload(out[r] + c0 + kW * c) * alpha[r];
  }
  for (int j = j0; j < j1; ++j) {
    if (prefetch) kv.prefetch_value(j);
    for (int c = 0; c < C; ++c) {
      const wf vv = kv.value(j, c0 + kW * c);
      for (int r = 0; r < R; ++r) acc[r][c] += p[r][j] * vv;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) wstore(out[r] + c0 + kW * c, acc[r][c]);
  }
}

// Online-softmax step of R queries over their scores of one KV tile, the queries' chains
// interleaved (alone, each is a long chain of dependent steps: the max, the rescale's exp, the
// exps, the sums). Query r's scores s[r][lo[r] .. hi[r]) become weights, -inf and then 0 elsewhere
// in the kW-position chunks w_lo .. w_hi that were computed; alpha[r] is the rescale factor of its
// accumulator. Lane i of an 8-lane sum adds the weights of the positions = i mod 8 in order, then
// the lanes add in order: the same bits whatever kW, and whatever chunks the micro-tile's other
// queries widen the range to (those add exact zeros).
template <int R>
[[gnu::always_inline]] inline void softmax_step(float (*s)[kT], const int* lo, const int* hi, int w_lo, int w_hi,
                                                const int* idx, float* run_max, float* run_sum, float* alpha) {
  wfi iota;
  for (int i = 0; i < kW; ++i) iota[i] = i;
  const wf neg_inf = wf{} - INFINITY;
  wf vmax[R];
  for (int r = 0; r < R; ++r) vmax[r] = neg_inf;
  // Every query sees every computed position (all but a prompt's last tile, or a window's
  // first): nothing to mask, and no -inf to keep from the exps below.
  bool whole = true;
  for (int r = 0; r < R; ++r) whole = whole && lo[r] <= w_lo * kW && hi[r] >= w_hi * kW;
  for (int c = w_lo; c < w_hi; ++c) {
    const wfi pos = iota + c * kW;
    for (int r = 0; r < R; ++r) {
      wf x = wload(s[r] + kW * c);
      if (!whole) {
        x = (pos < lo[r]) | (pos >= hi[r]) ? neg_inf : x;
        wstore(s[r] + kW * c, x);
      }
      vmax[r] = x > vmax[r] ? x : vmax[r];  // a max is exact in any order
    }
  }
  float new_max[R];
  vf old_v = {}, new_v = {};
  for (int r = 0; r < R; ++r) {
    float mx = vmax[r][0];
    for (int i = 1; i < kW; ++i) mx = std::max(mx, vmax[r][i]);
    new_max[r] = std::max(run_max[idx[r]], mx);
    old_v[r] = run_max[idx[r]];
    new_v[r] = new_max[r];
  }
  const vf rescale = vexp(old_v - new_v);
#if defined(LLMD_ATTN_WIDE) || defined(LLMD_ATTN_F16C)
  vf sum[R] = {};
#else
  wf sum[R][2] = {};  // lanes 0-3 and 4-7 of the 8-lane sum: positions = 0-3 and 4-7 mod 8
#endif
  for (int c = w_lo; c < w_hi; ++c) {
    for (int r = 0; r < R; ++r) {
      const wf raw = wload(s[r] + kW * c);
      const wf x = raw - new_max[r];  // <= 0
      const wf e = whole ? vexp_n<wf, wfi, true>(x) : (raw == neg_inf) ? wf{} : vexp_n<wf, wfi, true>(x);
      wstore(s[r] + kW * c, e);
#if defined(LLMD_ATTN_WIDE)
      sum[r] += __builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7);
      sum[r] += __builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15);
#elif defined(LLMD_ATTN_F16C)
      sum[r] += e;
#else
      sum[r][c & 1] += e;
#endif
    }
  }
  for (int r = 0; r < R; ++r) {
    float total = 0.f;
#if defined(LLMD_ATTN_WIDE) || defined(LLMD_ATTN_F16C)
    for (int i = 0; i < kLanes; ++i) total += sum[r][i];
#else
    for (int i = 0; i < kLanes; ++i) total += sum[r][i / kW][i % kW];
#endif
    float& m = run_max[idx[r]];
    float& l = run_sum[idx[r]];
    alpha[r] = m == -INFINITY ? 0.f : rescale[r];
    l = l * alpha[r] + total;
    m = new_max[r];
  }
}

// R active queries (indices idx[]) of the tile over one KV tile starting at absolute position t0.
template <int R, class Tile>
[[gnu::always_inline]] inline void micro_tile(const AttentionTile& tile, const int* idx, int t0, const Tile& kv,
                                              int head_dim, bool prefetch, float* run_max, float* run_sum,
                                              float (*s)[kT]) {
  const float* q[R];
  float* out[R];
  int lo[R], hi[R];
  int j0 = kT, j1 = 0;
  for (int r = 0; r < R; ++r) {
    const int i = idx[r];
    q[r] = tile.q[i];
    out[r] = tile.out[i];
    lo[r] = std::max(tile.first_pos[i] - t0, 0);
    hi[r] = std::min(tile.n_pos[i] - t0, kT);
    j0 = std::min(j0, lo[r]);
    j1 = std::max(j1, hi[r]);
  }
  // Scores of the kW-position chunks that hold [j0, j1) (positions outside a query's range get
  // weight 0).
  const int w_lo = j0 / kW;
  const int w_hi = (j1 + kW - 1) / kW;
  constexpr int C = sweep_chunks(R);
  int c = w_lo;
  for (; c + C <= w_hi; c += C) score_sweep<R, C>(q, kv, head_dim, c, prefetch && c == w_lo, s);
  for (; c < w_hi; ++c) score_sweep<R, 1>(q, kv, head_dim, c, prefetch && c == w_lo, s);

  float alpha[R];
  softmax_step<R>(s, lo, hi, w_lo, w_hi, idx, run_max, run_sum, alpha);

  int c0 = 0;
  for (; c0 + kW * C <= head_dim; c0 += kW * C) {
    value_sweep<R, C>(out, alpha, kv, j0, j1, c0, prefetch && c0 == 0, s);
  }
  for (; c0 < head_dim; c0 += kW) value_sweep<R, 1>(out, alpha, kv, j0, j1, c0, false, s);
}

// One body for every fold of a span's result into a query's total (the sweep below between
// spans, PagedAttention after span tasks): not inlined, so the two cannot be compiled apart
// (e.g. one contracting a multiply and an add into an FMA and the other not).
[[gnu::noinline]] void fold_span(float* total, float* total_max, float* total_sum, const float* part, float part_max,
                                 float part_sum, int head_dim) {
  if (part_max == -INFINITY) return;  // the query saw no position of the span
  if (*total_max == -INFINITY) {
    std::memcpy(total, part, sizeof(float) * head_dim);
    *total_max = part_max;
    *total_sum = part_sum;
    return;
  }
  const float m = std::max(*total_max, part_max);
  const float a = std::exp(*total_max - m);
  const float b = std::exp(part_max - m);
  const vf va = splat(a), vb = splat(b);
  for (int c = 0; c < head_dim; c += kLanes) store(total + c, load(total + c) * va + load(part + c) * vb);
  *total_sum = *total_sum * a + part_sum * b;
  *total_max = m;
}

// total / total_sum: how every sweep ends, split or not (total may be out: one span, in place).
[[gnu::noinline]] void finish_spans(const float* total, float total_sum, float* out, int head_dim) {
  const vf inv = splat(1.f / total_sum);
  for (int c = 0; c < head_dim; c += kLanes) store(out + c, load(total + c) * inv);
}

template <class E>
void attend_tile(const AttentionTile& tile, const void* const* k_blocks, const void* const* v_blocks, int head_dim,
                 int block_tokens, float* scratch) {
  static_assert(kMicro == 4);
  // Element pointers of each block (float, float16 bits; quantized: the parts' bytes).
  using P = std::conditional_t<kQuantized<E>, uint8_t, E>;
  const auto* kb = reinterpret_cast<const P* const*>(k_blocks);
  const auto* vb = reinterpret_cast<const P* const*>(v_blocks);
  const int rows = tile.rows;
  float* run_max = scratch;
  float* run_sum = run_max + kMaxTileRows;
  auto* s = reinterpret_cast<float (*)[kT]>(run_sum + kMaxTileRows);
  float* kv32 = run_sum + kMaxTileRows + kMicro * kT;  // [head_dim][kT] keys, then [kT][head_dim] values
  // The spans folded so far of each query (a sweep over more than one span).
  float* total_max = kv32 + 2 * static_cast<size_t>(kT) * head_dim;
  float* total_sum = total_max + kMaxTileRows;
  float* total = total_sum + kMaxTileRows;  // [rows][head_dim]
  const bool span_task = tile.span_max != nullptr;

  int first = tile.first_pos[0], n_max = 0;
  for (int r = 0; r < rows; ++r) {
    run_max[r] = -INFINITY;
    run_sum[r] = 0.f;
    total_max[r] = -INFINITY;
    std::memset(tile.out[r], 0, sizeof(float) * head_dim);
    first = std::min(first, tile.first_pos[r]);
    n_max = std::max(n_max, tile.n_pos[r]);
  }
  // Each span is its own online softmax: at a span's end each query's state is folded into its
  // total and starts again (a span task's range lies in one span: it never folds).
  int span = span_of(first);
  bool folded = false;
  auto fold_rows = [&] {
    for (int r = 0; r < rows; ++r) {
      fold_span(total + static_cast<size_t>(r) * head_dim, &total_max[r], &total_sum[r], tile.out[r], run_max[r],
                run_sum[r], head_dim);
      run_max[r] = -INFINITY;
      run_sum[r] = 0.f;
      std::memset(tile.out[r], 0, sizeof(float) * head_dim);
    }
    folded = true;
  };
  // A float16 or quantized tile read by more than one micro-tile is converted once (exactly, so
  // the scores and sums are the same bits as when they read the halves or codes in registers).
  const bool convert = !std::is_same_v<E, float> && rows > kMicro;
  const int t_end = (n_max + kT - 1) / kT;
  // Block index and offset in it of tile t.
  auto tile_at = [&](int t) { return std::pair{t * kT / block_tokens, t * kT % block_tokens}; };
  for (int t = first / kT; t < t_end; ++t) {
    const int t0 = t * kT;
    if (span_of(t0) != span) {
      fold_rows();
      span = span_of(t0);
    }
    int active[kMaxTileRows];
    int n_active = 0;
    for (int r = 0; r < rows; ++r) {
      if (tile.first_pos[r] < t0 + kT && tile.n_pos[r] > t0) active[n_active++] = r;
    }
    if (n_active == 0) continue;
    const auto [b, off] = tile_at(t);
    bool has_next = t + 1 < t_end;
    const auto [nb, noff] = has_next ? tile_at(t + 1) : std::pair{b, off};
    auto run = [&](const auto& kv) {
      int i = 0;
      for (; i + 4 <= n_active; i += 4) {
        micro_tile<4>(tile, active + i, t0, kv, head_dim, has_next && i == 0, run_max, run_sum, s);
      }
      switch (n_active - i) {
        case 1:
          return micro_tile<1>(tile, active + i, t0, kv, head_dim, has_next && i == 0, run_max, run_sum, s);
        case 2:
          return micro_tile<2>(tile, active + i, t0, kv, head_dim, has_next && i == 0, run_max, run_sum, s);
        case 3:
          return micro_tile<3>(tile, active + i, t0, kv, head_dim, has_next && i == 0, run_max, run_sum, s);
        default:
          return;
      }
    };
    float* k32 = kv32;
    float* v32 = kv32 + static_cast<size_t>(kT) * head_dim;
    if constexpr (kQuantized<E>) {
      if (convert) {
        dequantize_keys<E>(kb[b], off, head_dim, block_tokens, has_next ? kb[nb] : nullptr, k32);
        dequantize_values<E>(vb[b], off, head_dim, block_tokens, has_next ? vb[nb] : nullptr, v32);
        has_next = false;  // requested above
        run(KvTile<float>{k32, kT, v32, nullptr, 0, nullptr, head_dim});
      } else {
        constexpr KvType type = std::is_same_v<E, Q8> ? KvType::Q8_0 : KvType::Q4_0;
        const size_t plane = kv_quant::plane_bytes(type, head_dim, block_tokens);
        const int blocks = head_dim / kv_quant::kBlock;
        const int row_bytes = std::is_same_v<E, Q8> ? head_dim : head_dim / 2;
        // The scales of this tile's positions as floats (k32 is free: nothing is converted).
        float* kscale = k32;
        float* vscale = k32 + blocks * kT;
        const auto* ks = reinterpret_cast<const uint16_t*>(kb[b] + plane);
        for (int i = 0; i < blocks; ++i) {
          for (int j = 0; j < kT; j += kLanes) {
            store(kscale + i * kT + j, load_kv(ks + static_cast<size_t>(i) * block_tokens + off + j));
          }
        }
        const auto* vs = reinterpret_cast<const uint16_t*>(vb[b] + plane) + static_cast<size_t>(off) * blocks;
        for (int e = 0; e < kT * blocks; e += kLanes) store(vscale + e, load_kv(vs + e));
        if (has_next) {
          // The following tile's scales (its codes are requested row by row as this one is read).
          const auto* nks = kb[nb] + plane;
          for (int i = 0; i < blocks; ++i) {
            prefetch_span(nks + (static_cast<size_t>(i) * block_tokens + noff) * 2, kT * 2);
          }
          prefetch_span(vb[nb] + plane + static_cast<size_t>(noff) * blocks * 2, kT * blocks * 2);
        }
        run(QuantKvTile<E>{kb[b] + off, block_tokens, kscale, vb[b] + static_cast<size_t>(off) * row_bytes, vscale,
                           kb[nb] + noff, vb[nb] + static_cast<size_t>(noff) * row_bytes, head_dim});
      }
    } else {
      const E* k = kb[b] + off;
      const E* v = vb[b] + static_cast<size_t>(off) * head_dim;
      const E* nk = kb[nb] + noff;
      const E* nv = vb[nb] + static_cast<size_t>(noff) * head_dim;
      if (convert) {
        // Converted tiles are read from L1/L2 by many micro-tiles: the next tile is requested
        // here, as this one is converted, rather than by the first micro-tile.
        for (int d = 0; d < head_dim; ++d) {
          if (has_next) prefetch_span(nk + static_cast<size_t>(d) * block_tokens, kT * sizeof(E));
          for (int j = 0; j < kT; j += kLanes) {
            store(k32 + static_cast<size_t>(d) * kT + j, load_kv(k + static_cast<size_t>(d) * block_tokens + j));
          }
        }
        for (int j = 0; j < kT; ++j) {
          if (has_next) prefetch_span(nv + static_cast<size_t>(j) * head_dim, head_dim * sizeof(E));
          for (int c = 0; c < head_dim; c += kLanes) {
            const size_t e = static_cast<size_t>(j) * head_dim + c;
            store(v32 + e, load_kv(v + e));
          }
        }
        has_next = false;
        run(KvTile<float>{k32, kT, v32, nullptr, 0, nullptr, head_dim});
      } else {
        run(KvTile<E>{k, block_tokens, v, nk, block_tokens, nv, head_dim});
      }
    }
  }
  if (span_task) {
    for (int r = 0; r < rows; ++r) {
      tile.span_max[r] = run_max[r];
      tile.span_sum[r] = run_sum[r];
    }
    return;
  }
  // Normalised by the one body a split query's result is normalised with (one span: in place).
  for (int r = 0; r < rows; ++r) {
    if (!folded) {
      finish_spans(tile.out[r], run_sum[r], tile.out[r], head_dim);
      continue;
    }
    float* t = total + static_cast<size_t>(r) * head_dim;
    fold_span(t, &total_max[r], &total_sum[r], tile.out[r], run_max[r], run_sum[r], head_dim);
    finish_spans(t, total_sum[r], tile.out[r], head_dim);
  }
}

void floats_to_halves(const float* x, uint16_t* out, int n) {
  int i = 0;
#if defined(LLMD_ATTN_F16C)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = float_to_half(x[i]);
}

}  // namespace

const AttentionKernels* kernels() {
  static const AttentionKernels table{LLMD_ATTN_NAME,   &attend_tile<float>, &attend_tile<uint16_t>,
                                      &attend_tile<Q8>, &attend_tile<Q4>,    &floats_to_halves,
                                      &fold_span,       &finish_spans};
  return &table;
}

}  // namespace llmd::attention::LLMD_ATTN_NS
