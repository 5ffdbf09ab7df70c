#include "attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace llmd {

#pragma GCC diagnostic ignored "-Wpsabi"  // helpers are always inlined into each clone

namespace {

using v16 = float __attribute__((vector_size(64)));
using v16i = int __attribute__((vector_size(64)));

#define LLMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

[[gnu::always_inline]] inline v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
[[gnu::always_inline]] inline v16 splat(float x) { return v16{} + x; }

// exp(x) for x <= 0 (softmax after max subtraction): Cody-Waite range reduction + degree-6
// polynomial; relative error ~2e-7, underflows to 0 below -87.
[[gnu::always_inline]] inline v16 vexp(v16 x) {
  x = x < -87.f ? splat(-87.f) : x;
  const v16 y = x * 1.44269504088896341f + 0.5f;
  const v16 t = __builtin_convertvector(__builtin_convertvector(y, v16i), v16);
  const v16 fx = t - ((t > y) ? splat(1.f) : splat(0.f));  // floor(y)
  v16 r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const v16i bits = (__builtin_convertvector(fx, v16i) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace

#if defined(__x86_64__)
LLMD_CLONES
#endif
void attend_tile(const AttentionTile& tile, const float* const* k_blocks, const float* const* v_blocks,
                 int head_dim, int block_tokens, float* scratch) {
  const int R = tile.rows;
  int n_max = 0;
  int lo = tile.first_pos[0];
  for (int r = 0; r < R; ++r) {
    n_max = std::max(n_max, tile.n_pos[r]);
    lo = std::min(lo, tile.first_pos[r]);
  }
  lo = lo / 16 * 16;  // vector-aligned start (blocks are a multiple of 16 positions)
  const int padded = (n_max + 15) / 16 * 16;
  float* scores[kMaxTileRows];
  for (int r = 0; r < R; ++r) scores[r] = scratch + static_cast<size_t>(r) * padded;

  // Scores, 16 positions at a time: s[j..j+16] += q[d] * Kt[d][j..j+16].
  for (int j0 = lo; j0 < n_max; j0 += 16) {
    const float* kt = k_blocks[j0 / block_tokens] + (j0 % block_tokens);
    v16 acc[kMaxTileRows] = {};
    for (int d = 0; d < head_dim; ++d) {
      const v16 k = load(kt + static_cast<size_t>(d) * block_tokens);
      for (int r = 0; r < R; ++r) acc[r] += tile.q[r][d] * k;
    }
    for (int r = 0; r < R; ++r) store(scores[r] + j0, acc[r]);
  }

  // Softmax of each row over its own range; positions outside it weigh exactly 0.
  float inv_sum[kMaxTileRows];
  for (int r = 0; r < R; ++r) {
    const int first = tile.first_pos[r];
    const int n = tile.n_pos[r];
    float* s = scores[r];
    float mx = s[first];
    for (int j = first + 1; j < n; ++j) mx = std::max(mx, s[j]);
    for (int j = lo; j < first; ++j) s[j] = -INFINITY;
    for (int j = n; j < padded; ++j) s[j] = -INFINITY;
    v16 sum = {};
    for (int j = lo; j < padded; j += 16) {
      const v16 raw = load(s + j);
      const v16 e = (raw == -INFINITY) ? splat(0.f) : vexp(raw - mx);
      store(s + j, e);
      sum += e;
    }
    float total = 0.f;
    for (int i = 0; i < 16; ++i) total += sum[i];
    inv_sum[r] = 1.f / total;
  }

  // out = sum_j p_j * V[j], head_dim in chunks of 16 (head_dim % 16 == 0).
  const int chunks = head_dim / 16;
  for (int c0 = 0; c0 < chunks; c0 += 4) {
    const int cn = std::min(4, chunks - c0);
    v16 acc[kMaxTileRows][4] = {};
    for (int j = lo; j < n_max; ++j) {
      const float* v = v_blocks[j / block_tokens] + static_cast<size_t>(j % block_tokens) * head_dim + c0 * 16;
      for (int c = 0; c < cn; ++c) {
        const v16 vv = load(v + c * 16);
        for (int r = 0; r < R; ++r) acc[r][c] += scores[r][j] * vv;
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < cn; ++c) store(tile.out[r] + (c0 + c) * 16, acc[r][c] * inv_sum[r]);
    }
  }
}

}  // namespace llmd
