#include "attention_kernels.h"

#include <algorithm>
#include <cmath>

#include "../core/scratch.h"
#include "kernels/qgemm.h"

namespace llmd {

const AttentionKernels& attention_kernels_for(const std::string& kernel_path) {
#if defined(__x86_64__) || defined(_M_X64)
  // The matmul paths' runtime checks cover these variants' flags (AVX-512 F/BW/VL with VNNI
  // implies what attention_avx512.cpp is built with; avx2 includes FMA and F16C).
  if (kernel_path == "avx512vnni") return *attention::avx512::kernels();
  if (kernel_path == "avx2") return *attention::avx2::kernels();
#endif
  return *attention::generic::kernels();
}

AttentionTileScratch& attention_tile_scratch(int head_dim) {
  thread_local AttentionTileScratch scratch;
  grow_scratch(scratch.floats, attention_scratch_floats(head_dim));
  return scratch;
}

std::pair<int, int> tile_spans(const AttentionTile& tile) {
  int first = span_of(tile.first_pos[0]), last = span_of(tile.n_pos[0] - 1);
  for (int q = 1; q < tile.rows; ++q) {
    first = std::min(first, span_of(tile.first_pos[q]));
    last = std::max(last, span_of(tile.n_pos[q] - 1));
  }
  return {first, last};
}

AttentionTile span_task(const AttentionTile& tile, int span, float* part, int head_dim) {
  AttentionTile t = tile;
  const int s0 = span * kKvSpan, s1 = s0 + kKvSpan;
  for (int q = 0; q < t.rows; ++q) {
    // This span's part of the query's range, or an empty one at the span's start.
    const int lo = std::max(tile.first_pos[q], s0), hi = std::min(tile.n_pos[q], s1);
    t.first_pos[q] = hi > lo ? lo : s0;
    t.n_pos[q] = hi > lo ? hi : s0;
    t.out[q] = part + static_cast<size_t>(q) * head_dim;
  }
  t.span_max = part + static_cast<size_t>(t.rows) * head_dim;
  t.span_sum = t.span_max + t.rows;
  return t;
}

void fold_span_tasks(const AttentionKernels& kernels, const AttentionTile& tile, const float* parts, int spans,
                     int head_dim) {
  thread_local std::vector<float> total;
  float* t = grow_scratch(total, static_cast<size_t>(head_dim));
  const size_t per_span = span_part_floats(tile.rows, head_dim);
  for (int q = 0; q < tile.rows; ++q) {
    float total_max = -INFINITY, total_sum = 0.f;
    for (int k = 0; k < spans; ++k) {
      const float* part = parts + k * per_span;
      const float* maxima = part + static_cast<size_t>(tile.rows) * head_dim;
      kernels.fold_span(t, &total_max, &total_sum, part + static_cast<size_t>(q) * head_dim, maxima[q],
                        maxima[tile.rows + q], head_dim);
    }
    kernels.finish_spans(t, total_sum, tile.out[q], head_dim);
  }
}

const AttentionKernels& attention_kernels() {
  static const AttentionKernels& chosen = attention_kernels_for(kernels::active_table().isa);
  return chosen;
}

std::string attention_path(KvType type) {
  return std::string("llmd:") + kv_type_name(type) + ":" + attention_kernels().isa;
}

}  // namespace llmd
