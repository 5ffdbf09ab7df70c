// The attention kernel body, compiled once per instruction set: attention_<isa>.cpp defines
// LLMD_ATTN_NS (and LLMD_ATTN_F16C where the TU is built with -mf16c) and includes this file;
// attention_kernels.cpp picks the variant that follows the active matmul path, so
// LLMD_CPU_PATH forces attention down with the matmuls and tests can run every variant.
//
// Keys and values are read in the pool's element type (float32, or float16 converted 8 lanes
// at a time right where they are loaded: no dequantized copy of the KV is ever made). Each
// query's arithmetic (score order over positions, softmax, value accumulation order) is
// independent of the other queries in the tile, so a sequence's output does not depend on what
// it is batched with.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../../core/fp16.h"
#include "../attention_kernels.h"
#include "../simd.h"

#if defined(LLMD_ATTN_F16C)
#include <immintrin.h>
#endif

namespace llmd::attention::LLMD_ATTN_NS {

namespace {

using namespace simd;

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

// Scores of R queries over C consecutive kLanes-position chunks starting at j0 (the chunks of a
// sweep share nothing but independent accumulators: more chunks per sweep only shortens the
// FMA dependency chains of small tiles; each score is the same sum in the same order).
template <int R, int C, class E>
[[gnu::always_inline]] inline void score_sweep(const AttentionTile& tile, const E* const* k_blocks, int head_dim,
                                               int block_tokens, int j0, int n_end, float* const* scores) {
  const E* kt[C];
  for (int c = 0; c < C; ++c) {
    const int j = j0 + kLanes * c;
    kt[c] = k_blocks[j / block_tokens] + (j % block_tokens);
  }
  // Decode reads each key once per step, mostly from DRAM: ask for the next sweep's lines
  // while this one computes.
  const int next = j0 + kLanes * C;
  const E* kt_next = next < n_end ? k_blocks[next / block_tokens] + (next % block_tokens) : nullptr;
  vf acc[R][C] = {};
  for (int d = 0; d < head_dim; ++d) {
    if (kt_next) __builtin_prefetch(kt_next + static_cast<size_t>(d) * block_tokens);
    for (int c = 0; c < C; ++c) {
      const vf k = load_kv(kt[c] + static_cast<size_t>(d) * block_tokens);
      for (int r = 0; r < R; ++r) acc[r][c] += tile.q[r][d] * k;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) store(scores[r] + j0 + kLanes * c, acc[r][c]);
  }
}

// out[c0 .. c0 + kLanes * C] = sum_j p_j * V[j][...] for R queries, positions in order.
template <int R, int C, class E>
[[gnu::always_inline]] inline void value_sweep(const AttentionTile& tile, const E* const* v_blocks, int head_dim,
                                               int block_tokens, int lo, int n_max, int c0, const float* const* scores,
                                               const float* inv_sum) {
  vf acc[R][C] = {};
  constexpr int kAhead = 4;  // rows of V requested ahead (see score_sweep)
  for (int j = lo; j < n_max; ++j) {
    const E* v = v_blocks[j / block_tokens] + static_cast<size_t>(j % block_tokens) * head_dim + c0;
    if (j + kAhead < n_max) {
      const int ja = j + kAhead;
      __builtin_prefetch(v_blocks[ja / block_tokens] + static_cast<size_t>(ja % block_tokens) * head_dim + c0);
    }
    for (int c = 0; c < C; ++c) {
      const vf vv = load_kv(v + kLanes * c);
      for (int r = 0; r < R; ++r) acc[r][c] += scores[r][j] * vv;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) store(tile.out[r] + c0 + kLanes * c, acc[r][c] * inv_sum[r]);
  }
}

// The tile with R queries; sweeps take 8 / R chunks so that R * C accumulators fit AVX2's
// registers with the most independent chains.
template <int R, class E>
[[gnu::always_inline]] inline void attend_rows(const AttentionTile& tile, const E* const* k_blocks,
                                               const E* const* v_blocks, int head_dim, int block_tokens,
                                               float* scratch) {
  constexpr int C = 8 / R;
  int n_max = 0;
  int lo = tile.first_pos[0];
  for (int r = 0; r < R; ++r) {
    n_max = std::max(n_max, tile.n_pos[r]);
    lo = std::min(lo, tile.first_pos[r]);
  }
  lo = lo / 16 * 16;  // vector-aligned start (blocks are a multiple of 16 positions)
  const int padded = (n_max + 15) / 16 * 16;
  float* scores[R];
  for (int r = 0; r < R; ++r) scores[r] = scratch + static_cast<size_t>(r) * padded;

  int j0 = lo;
  for (; j0 + kLanes * C <= padded; j0 += kLanes * C) {
    score_sweep<R, C>(tile, k_blocks, head_dim, block_tokens, j0, padded, scores);
  }
  for (; j0 < padded; j0 += kLanes) score_sweep<R, 1>(tile, k_blocks, head_dim, block_tokens, j0, padded, scores);

  // Softmax of each row over its own range; positions outside it weigh exactly 0.
  float inv_sum[R];
  for (int r = 0; r < R; ++r) {
    const int first = tile.first_pos[r];
    const int n = tile.n_pos[r];
    float* s = scores[r];
    float mx = s[first];
    for (int j = first + 1; j < n; ++j) mx = std::max(mx, s[j]);
    for (int j = lo; j < first; ++j) s[j] = -INFINITY;
    for (int j = n; j < padded; ++j) s[j] = -INFINITY;
    vf sum = {};
    for (int j = lo; j < padded; j += kLanes) {
      const vf raw = load(s + j);
      const vf e = (raw == -INFINITY) ? splat(0.f) : vexp(raw - mx);
      store(s + j, e);
      sum += e;
    }
    float total = 0.f;
    for (int i = 0; i < kLanes; ++i) total += sum[i];
    inv_sum[r] = 1.f / total;
  }

  // head_dim % 16 == 0
  int c0 = 0;
  for (; c0 + kLanes * C <= head_dim; c0 += kLanes * C) {
    value_sweep<R, C>(tile, v_blocks, head_dim, block_tokens, lo, n_max, c0, scores, inv_sum);
  }
  for (; c0 < head_dim; c0 += kLanes)
    value_sweep<R, 1>(tile, v_blocks, head_dim, block_tokens, lo, n_max, c0, scores, inv_sum);
}

template <class E>
void attend_tile(const AttentionTile& tile, const void* const* k_blocks, const void* const* v_blocks, int head_dim,
                 int block_tokens, float* scratch) {
  static_assert(kMaxTileRows == 4);
  const auto* k = reinterpret_cast<const E* const*>(k_blocks);
  const auto* v = reinterpret_cast<const E* const*>(v_blocks);
  switch (tile.rows) {
    case 1:
      return attend_rows<1>(tile, k, v, head_dim, block_tokens, scratch);
    case 2:
      return attend_rows<2>(tile, k, v, head_dim, block_tokens, scratch);
    case 3:
      return attend_rows<3>(tile, k, v, head_dim, block_tokens, scratch);
    default:
      return attend_rows<4>(tile, k, v, head_dim, block_tokens, scratch);
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
  static const AttentionKernels table{LLMD_ATTN_NAME, &attend_tile<float>, &attend_tile<uint16_t>, &floats_to_halves};
  return &table;
}

}  // namespace llmd::attention::LLMD_ATTN_NS
