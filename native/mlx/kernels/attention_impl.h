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
// Keys and values are read in the pool's element type (float32, or float16 converted 8 lanes
// at a time where they are loaded, or once per KV tile into a float32 copy when many queries
// share it: the conversion is exact, so the two give the same bits; q8_0 / q4_0 blocks are
// dequantized once per KV tile into that copy, never for the whole cache). Each query's arithmetic
// depends only on its own range and the KV: the tiles it visits (fixed by absolute positions),
// the score sum over head_dim, the max, the per-tile exp and sums, the value accumulation over
// positions in order. Queries sharing a micro-tile only widen the range of positions a query
// adds with weight exactly 0 (which changes no value, at most the sign of a zero), so a result
// does not depend on what the query is batched with, nor on whether its prompt was prefilled in
// one chunk, several, or step by step (decode runs this same kernel).
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

// The sweeps' vector: 16 floats (one zmm register) in the AVX-512 variant, which halves the
// FMA instructions on cores with full-width AVX-512 units; 8 elsewhere. Each lane's arithmetic
// (a score's sum over head_dim, an output's sum over positions) is the same whatever the width,
// and the softmax steps stay on 8-lane vectors, so every variant gives the same bits.
#if defined(LLMD_ATTN_WIDE)
constexpr int kW = 16;
using wf = float __attribute__((vector_size(64)));
#else
constexpr int kW = kLanes;
using wf = vf;
#endif
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
#else
  return load_kv(p);
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

// Quantized KV (kv_quant.h's layout): attend_tile<Q8> / <Q4> dequantize each KV tile into the
// float32 tile buffer (keys [head_dim][kT], values [kT][head_dim]) once, then every micro-tile
// reads floats from L1/L2 as for a converted float16 tile. Dequantization is exact (q * d fits
// a float), so the scores are those of float32 attention over the dequantized numbers.
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
};

// Scores of R queries over C consecutive chunks starting at chunk c0 of the tile. Each score is
// the same sum over head_dim in the same order whatever R and C (their accumulators are
// independent; more chunks per sweep only shortens the FMA chains of small tiles).
template <int R, int C, class E>
[[gnu::always_inline]] inline void score_sweep(const float* const* q, const KvTile<E>& kv, int head_dim, int c0,
                                               bool prefetch, float (*s)[kT]) {
  wf acc[R][C] = {};
  const E* k = kv.k + kW * c0;
  for (int d = 0; d < head_dim; ++d) {
    if (prefetch) prefetch_span(kv.next_k + static_cast<size_t>(d) * kv.next_kstride, kT * sizeof(E));
    const E* kd = k + static_cast<size_t>(d) * kv.kstride;
    for (int c = 0; c < C; ++c) {
      const wf kk = wload_kv(kd + kW * c);
      for (int r = 0; r < R; ++r) acc[r][c] += q[r][d] * kk;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) wstore(s[r] + kW * (c0 + c), acc[r][c]);
  }
}

// acc[c0 ..] = acc * alpha + sum_j p_j * V[j][c0 ..] for R queries, positions j0 .. j1 - 1 in
// order (a query's weights outside its own range are exactly 0).
template <int R, int C, class E>
[[gnu::always_inline]] inline void value_sweep(float* const* out, const float* alpha, const KvTile<E>& kv, int head_dim,
                                               int j0, int j1, int c0, bool prefetch, const float (*p)[kT]) {
  wf acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = wload(out[r] + c0 + kW * c) * alpha[r];
  }
  for (int j = j0; j < j1; ++j) {
    if (prefetch) prefetch_span(kv.next_v + static_cast<size_t>(j) * head_dim, head_dim * sizeof(E));
    const E* v = kv.v + static_cast<size_t>(j) * head_dim + c0;
    for (int c = 0; c < C; ++c) {
      const wf vv = wload_kv(v + kW * c);
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
  using wfi = int __attribute__((vector_size(sizeof(wf))));
  wfi iota;
  for (int i = 0; i < kW; ++i) iota[i] = i;
  const wf neg_inf = wf{} - INFINITY;
  wf vmax[R];
  for (int r = 0; r < R; ++r) vmax[r] = neg_inf;
  for (int c = w_lo; c < w_hi; ++c) {
    const wfi pos = iota + c * kW;
    for (int r = 0; r < R; ++r) {
      wf x = wload(s[r] + kW * c);
      x = (pos < lo[r]) | (pos >= hi[r]) ? neg_inf : x;
      wstore(s[r] + kW * c, x);
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
  vf sum[R] = {};
  for (int c = w_lo; c < w_hi; ++c) {
    for (int r = 0; r < R; ++r) {
      const wf raw = wload(s[r] + kW * c);
      const wf e = (raw == neg_inf) ? wf{} : vexp_n<wf, wfi>(raw - new_max[r]);
      wstore(s[r] + kW * c, e);
#if defined(LLMD_ATTN_WIDE)
      sum[r] += __builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7);
      sum[r] += __builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15);
#else
      sum[r] += e;
#endif
    }
  }
  for (int r = 0; r < R; ++r) {
    float total = 0.f;
    for (int i = 0; i < kLanes; ++i) total += sum[r][i];
    float& m = run_max[idx[r]];
    float& l = run_sum[idx[r]];
    alpha[r] = m == -INFINITY ? 0.f : rescale[r];
    l = l * alpha[r] + total;
    m = new_max[r];
  }
}

// R active queries (indices idx[]) of the tile over one KV tile starting at absolute position t0.
template <int R, class E>
[[gnu::always_inline]] inline void micro_tile(const AttentionTile& tile, const int* idx, int t0, const KvTile<E>& kv,
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
    value_sweep<R, C>(out, alpha, kv, head_dim, j0, j1, c0, prefetch && c0 == 0, s);
  }
  for (; c0 < head_dim; c0 += kW) value_sweep<R, 1>(out, alpha, kv, head_dim, j0, j1, c0, false, s);
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

  int first = tile.first_pos[0], n_max = 0;
  for (int r = 0; r < rows; ++r) {
    run_max[r] = -INFINITY;
    run_sum[r] = 0.f;
    std::memset(tile.out[r], 0, sizeof(float) * head_dim);
    first = std::min(first, tile.first_pos[r]);
    n_max = std::max(n_max, tile.n_pos[r]);
  }
  // A float16 tile read by more than one micro-tile is converted once (exactly, so the scores
  // and sums are the same bits as when they read the halves); a quantized tile always is.
  const bool convert = kQuantized<E> || (std::is_same_v<E, uint16_t> && rows > kMicro);
  const int t_end = (n_max + kT - 1) / kT;
  // Block index and offset in it of tile t.
  auto tile_at = [&](int t) { return std::pair{t * kT / block_tokens, t * kT % block_tokens}; };
  for (int t = first / kT; t < t_end; ++t) {
    const int t0 = t * kT;
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
      dequantize_keys<E>(kb[b], off, head_dim, block_tokens, has_next ? kb[nb] : nullptr, k32);
      dequantize_values<E>(vb[b], off, head_dim, block_tokens, has_next ? vb[nb] : nullptr, v32);
      has_next = false;  // requested above
      run(KvTile<float>{k32, kT, v32, nullptr, 0, nullptr});
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
        run(KvTile<float>{k32, kT, v32, nullptr, 0, nullptr});
      } else {
        run(KvTile<E>{k, block_tokens, v, nk, block_tokens, nv});
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const vf inv = splat(1.f / run_sum[r]);
    for (int c = 0; c < head_dim; c += kLanes) store(tile.out[r] + c, load(tile.out[r] + c) * inv);
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
  static const AttentionKernels table{LLMD_ATTN_NAME,     &attend_tile<float>, &attend_tile<uint16_t>,
                                      &attend_tile<Q8>,   &attend_tile<Q4>,    &floats_to_halves};
  return &table;
}

}  // namespace llmd::attention::LLMD_ATTN_NS
