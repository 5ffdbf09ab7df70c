// SIMD attention of query tiles over block-paged KV (one head), used by PagedAttention.
//
// One kernel body (kernels/attention_impl.h) is built once per instruction set with that
// set's flags (kernels/attention_<isa>.cpp) and chosen at run time together with the matmul
// kernels: the variant follows kernels::active_table(), so LLMD_CPU_PATH forces attention down
// too and every variant is testable on a CPU that runs it. Keys and values are read in the KV
// pool's element type (KvType), float16 and q8_0 / q4_0 blocks converted in registers as they
// are loaded (decode), or once per KV tile into a float32 tile buffer when many queries share
// it (prefill).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../core/kv_cache.h"

namespace llmd {

// Queries per tile: a prefill tile holds rows of one sequence x the heads of one KV group, so
// that each KV tile loaded serves all of them (decode: the group's heads of one row).
constexpr int kMaxTileRows = 64;
// Positions per KV tile of the online softmax, aligned to absolute positions (a query's tile
// boundaries, hence its arithmetic, do not depend on how its prompt was split into steps).
// Blocks hold a whole number of KV tiles.
constexpr int kKvTile = 64;
static_assert(KvPool::kBlockTokens % kKvTile == 0);
// Positions per span, aligned to absolute positions. A query's attention is one online softmax
// per span, and the spans' results are folded in order (fold_span, then finish_spans): so a
// long range can be split into tasks, one span each, that run on different threads (decode of a
// few sequences, whose tiles alone are fewer than the threads) with the same bits as one sweep.
// A range within one span is computed exactly as before spans existed.
constexpr int kKvSpan = 512;
static_assert(kKvSpan % KvPool::kBlockTokens == 0);

struct AttentionTile {
  int rows = 0;                        // queries in the tile (<= kMaxTileRows)
  const float* q[kMaxTileRows];        // rotated and pre-scaled query vectors, head_dim each
  int n_pos[kMaxTileRows];             // causal length of each query (positions 0..n_pos-1)
  int first_pos[kMaxTileRows] = {};    // first position each query sees (sliding windows)
  float* out[kMaxTileRows];            // head_dim outputs each
  // Null: each out is the query's attention. Set (a span task: every query's range lies in one
  // span): out gets the span's unnormalised sum of weighted values, and these the span's
  // running max and sum of each query (max -inf: no position of the span), for fold_span.
  float* span_max = nullptr;
  float* span_sum = nullptr;
};

// The span a position lies in.
constexpr int span_of(int pos) { return pos / kKvSpan; }

// Floats of scratch a tile needs: running max and sum per query, scores of a micro-tile, and a
// float32 copy of one KV tile's keys and values.
constexpr size_t attention_scratch_floats(int head_dim) {
  return 2 * kMaxTileRows + 4 * kKvTile + 2 * static_cast<size_t>(kKvTile) * head_dim +
         static_cast<size_t>(kMaxTileRows) * (head_dim + 2);  // the folded spans of a multi-span sweep
}

// What a thread's attention tiles work in: the per-block key and value pointers a tile hands
// the kernel, and its float scratch. One per thread, kept across tiles and steps: the thread
// pool calls a task once per tile, and a fresh zeroed scratch each time was 34 KB of memset per
// tile, 720 tiles a step for 8 sequences of the test model (scratch.h).
struct AttentionTileScratch {
  std::vector<const void*> k_blocks;
  std::vector<const void*> v_blocks;
  std::vector<float> floats;  // at least attention_scratch_floats(head_dim) (grow-only, scratch.h)
};
// This thread's scratch, its floats grown for head_dim.
AttentionTileScratch& attention_tile_scratch(int head_dim);

// k_blocks[b]: [head_dim][block_tokens] transposed keys of block b; v_blocks[b]:
// [block_tokens][head_dim] values, both of the kernel's element type (float, or uint16_t
// halves; a quantized kernel takes one head's key and value parts in kv_quant.h's layout, and
// head_dim a multiple of 32). `scratch` holds attention_scratch_floats(head_dim) floats. Query r attends to
// positions first_pos[r] .. n_pos[r] - 1; blocks wholly before every query's window are not
// read. head_dim is a multiple of 16.
using AttendTileFn = void (*)(const AttentionTile& tile, const void* const* k_blocks, const void* const* v_blocks,
                              int head_dim, int block_tokens, float* scratch);

struct AttentionKernels {
  const char* isa;  // "avx512", "avx2" or "generic" (portable vectors: SSE2 on x86, NEON on arm64)
  AttendTileFn attend_f32;
  AttendTileFn attend_f16;
  AttendTileFn attend_q8_0;
  AttendTileFn attend_q4_0;
  // IEEE halves of x[0..n), rounded to nearest even (the KV write path).
  void (*floats_to_halves)(const float* x, uint16_t* out, int n);
  // Folds one span's result (a span task's out, max and sum) into a query's running total
  // (total, total_max, total_sum; max -inf: nothing yet), spans in order; then finish_spans
  // writes total / total_sum. The variant's own code, the code its sweeps fold with, so a split
  // query gets the bits of an unsplit one.
  void (*fold_span)(float* total, float* total_max, float* total_sum, const float* part, float part_max,
                    float part_sum, int head_dim);
  void (*finish_spans)(const float* total, float total_sum, float* out, int head_dim);

  AttendTileFn attend(KvType type) const {
    switch (type) {
      case KvType::F16:
        return attend_f16;
      case KvType::Q8_0:
        return attend_q8_0;
      case KvType::Q4_0:
        return attend_q4_0;
      case KvType::F32:
        break;
    }
    return attend_f32;
  }
};

// Span tasks (kKvSpan): the spans [first, last] a tile's queries read; a copy of the tile
// restricted to one span, its results going to `part` (span_part_floats: each query's sums,
// then the maxima and sums); and the tile's outputs from its span tasks' parts, spans in order.
std::pair<int, int> tile_spans(const AttentionTile& tile);
constexpr size_t span_part_floats(int rows, int head_dim) { return static_cast<size_t>(rows) * (head_dim + 2); }
AttentionTile span_task(const AttentionTile& tile, int span, float* part, int head_dim);
void fold_span_tasks(const AttentionKernels& kernels, const AttentionTile& tile, const float* parts, int spans,
                     int head_dim);

// The variant for a matmul kernel path ("avx512vnni", "avx2", "scalar", "neon", ...), and the
// one that follows the active path.
const AttentionKernels& attention_kernels_for(const std::string& kernel_path);
const AttentionKernels& attention_kernels();

// What the engine reports for attention over a CPU-backend pool, e.g. "llmd:f16:avx512".
std::string attention_path(KvType type);

namespace attention {
// Per-ISA tables (kernels/attention_<isa>.cpp; the x86 ones exist only in x86 builds).
namespace generic {
const AttentionKernels* kernels();
}
namespace avx2 {
const AttentionKernels* kernels();
}
namespace avx512 {
const AttentionKernels* kernels();
}
}  // namespace attention

}  // namespace llmd
