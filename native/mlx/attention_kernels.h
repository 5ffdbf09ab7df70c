// SIMD attention of query tiles over block-paged KV (one head), used by PagedAttention.
//
// Built once with GCC vector extensions and cloned per ISA (AVX-512, AVX2, baseline) with
// runtime selection, so it needs no -m flags. Each query's arithmetic (score order over
// positions, softmax, value accumulation order) is independent of the other queries in the
// tile, so a sequence's output does not depend on what it is batched with.
#pragma once

namespace llmd {

struct AttentionTile {
  int rows = 0;                  // queries in the tile (<= kMaxTileRows)
  const float* q[4];             // rotated and pre-scaled query vectors, head_dim each
  int n_pos[4];                  // causal length of each query (positions 0..n_pos-1)
  int first_pos[4] = {0, 0, 0, 0};  // first position each query sees (sliding windows)
  float* out[4];                 // head_dim outputs each
};

constexpr int kMaxTileRows = 4;

// k_blocks[b]: [head_dim][block_tokens] transposed keys of block b; v_blocks[b]:
// [block_tokens][head_dim] values. `scratch` holds kMaxTileRows * max(n_pos) floats. Query r
// attends to positions first_pos[r] .. n_pos[r] - 1; blocks wholly before every query's window
// are not read.
void attend_tile(const AttentionTile& tile, const float* const* k_blocks, const float* const* v_blocks,
                 int head_dim, int block_tokens, float* scratch);

}  // namespace llmd
