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
constexpr int kChunks = kT / kLanes;  // 8-position chunks of a KV tile
constexpr int kMicro = 4;             // queries whose scores and accumulators are held together
static_assert(kT % kLanes == 0);

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
  vf acc[R][C] = {};
  const E* k = kv.k + kLanes * c0;
  for (int d = 0; d < head_dim; ++d) {
    if (prefetch) prefetch_span(kv.next_k + static_cast<size_t>(d) * kv.next_kstride, kT * sizeof(E));
    const E* kd = k + static_cast<size_t>(d) * kv.kstride;
    for (int c = 0; c < C; ++c) {
      const vf kk = load_kv(kd + kLanes * c);
      for (int r = 0; r < R; ++r) acc[r][c] += q[r][d] * kk;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) store(s[r] + kLanes * (c0 + c), acc[r][c]);
  }
}

// acc[c0 ..] = acc * alpha + sum_j p_j * V[j][c0 ..] for R queries, positions j0 .. j1 - 1 in
// order (a query's weights outside its own range are exactly 0).
template <int R, int C, class E>
[[gnu::always_inline]] inline void value_sweep(float* const* out, const float* alpha, const KvTile<E>& kv, int head_dim,
                                               int j0, int j1, int c0, bool prefetch, const float (*p)[kT]) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = load(out[r] + c0 + kLanes * c) * alpha[r];
  }
  for (int j = j0; j < j1; ++j) {
    if (prefetch) prefetch_span(kv.next_v + static_cast<size_t>(j) * head_dim, head_dim * sizeof(E));
    const E* v = kv.v + static_cast<size_t>(j) * head_dim + c0;
    for (int c = 0; c < C; ++c) {
      const vf vv = load_kv(v + kLanes * c);
      for (int r = 0; r < R; ++r) acc[r][c] += p[r][j] * vv;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) store(out[r] + c0 + kLanes * c, acc[r][c]);
  }
}

// Online-softmax step of one query over its scores s[lo .. hi) of a tile (chunks c_lo .. c_hi
// were computed; the rest of them lies outside the query's range): turns s into weights (0
// outside [lo, hi)), updates the running max and sum, returns the accumulator's rescale factor.
// Not inlined: one copy of this arithmetic serves every tile shape.
[[gnu::noinline]] float softmax_step(float* s, int lo, int hi, int c_lo, int c_hi, float& run_max, float& run_sum) {
  for (int j = kLanes * c_lo; j < lo; ++j) s[j] = -INFINITY;
  for (int j = hi; j < kLanes * c_hi; ++j) s[j] = -INFINITY;
  vf vmax = splat(-INFINITY);  // a max is exact in any order
  for (int c = c_lo; c < c_hi; ++c) {
    const vf x = load(s + kLanes * c);
    vmax = x > vmax ? x : vmax;
  }
  float mx = vmax[0];
  for (int i = 1; i < kLanes; ++i) mx = std::max(mx, vmax[i]);
  const float new_max = std::max(run_max, mx);
  const float alpha = run_max == -INFINITY ? 0.f : vexp(splat(run_max - new_max))[0];
  // Lane i sums the positions = i mod 8 of the tile in order; chunks outside the query's range
  // add exact zeros.
  vf sum = {};
  for (int c = c_lo; c < c_hi; ++c) {
    const vf raw = load(s + kLanes * c);
    const vf e = (raw == -INFINITY) ? splat(0.f) : vexp(raw - new_max);
    store(s + kLanes * c, e);
    sum += e;
  }
  float total = 0.f;
  for (int i = 0; i < kLanes; ++i) total += sum[i];
  run_sum = run_sum * alpha + total;
  run_max = new_max;
  return alpha;
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
  const int c_lo = j0 / kLanes;
  const int c_hi = (j1 + kLanes - 1) / kLanes;
  constexpr int C = sweep_chunks(R);
  int c = c_lo;
  for (; c + C <= c_hi; c += C) score_sweep<R, C>(q, kv, head_dim, c, prefetch && c == c_lo, s);
  for (; c < c_hi; ++c) score_sweep<R, 1>(q, kv, head_dim, c, prefetch && c == c_lo, s);

  float alpha[R];
  for (int r = 0; r < R; ++r) {
    alpha[r] = softmax_step(s[r], lo[r], hi[r], c_lo, c_hi, run_max[idx[r]], run_sum[idx[r]]);
  }

  int c0 = 0;
  for (; c0 + kLanes * C <= head_dim; c0 += kLanes * C) {
    value_sweep<R, C>(out, alpha, kv, head_dim, j0, j1, c0, prefetch && c0 == 0, s);
  }
  for (; c0 < head_dim; c0 += kLanes) value_sweep<R, 1>(out, alpha, kv, head_dim, j0, j1, c0, false, s);
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
