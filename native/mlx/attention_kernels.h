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

struct AttentionTile {
  int rows = 0;                        // queries in the tile (<= kMaxTileRows)
  const float* q[kMaxTileRows];        // rotated and pre-scaled query vectors, head_dim each
  int n_pos[kMaxTileRows];             // causal length of each query (positions 0..n_pos-1)
  int first_pos[kMaxTileRows] = {};    // first position each query sees (sliding windows)
  float* out[kMaxTileRows];            // head_dim outputs each
};

// Floats of scratch a tile needs: running max and sum per query, scores of a micro-tile, and a
// float32 copy of one KV tile's keys and values.
constexpr size_t attention_scratch_floats(int head_dim) {
  return 2 * kMaxTileRows + 4 * kKvTile + 2 * static_cast<size_t>(kKvTile) * head_dim;
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
