// SIMD attention of query tiles over block-paged KV (one head), used by PagedAttention.
//
// One kernel body (kernels/attention_impl.h) is built once per instruction set with that
// set's flags (kernels/attention_<isa>.cpp) and chosen at run time together with the matmul
// kernels: the variant follows kernels::active_table(), so LLMD_CPU_PATH forces attention down
// too and every variant is testable on a CPU that runs it. Keys and values are read in the KV
// pool's element type (KvType), float16 converted in registers as it is loaded.
#pragma once

#include <cstdint>
#include <string>

#include "../core/kv_cache.h"

namespace llmd {

struct AttentionTile {
  int rows = 0;                     // queries in the tile (<= kMaxTileRows)
  const float* q[4];                // rotated and pre-scaled query vectors, head_dim each
  int n_pos[4];                     // causal length of each query (positions 0..n_pos-1)
  int first_pos[4] = {0, 0, 0, 0};  // first position each query sees (sliding windows)
  float* out[4];                    // head_dim outputs each
};

constexpr int kMaxTileRows = 4;

// k_blocks[b]: [head_dim][block_tokens] transposed keys of block b; v_blocks[b]:
// [block_tokens][head_dim] values, both of the kernel's element type (float, or uint16_t
// halves). `scratch` holds kMaxTileRows * max(n_pos) floats (rounded up to 16). Query r attends
// to positions first_pos[r] .. n_pos[r] - 1; blocks wholly before every query's window are not
// read.
using AttendTileFn = void (*)(const AttentionTile& tile, const void* const* k_blocks, const void* const* v_blocks,
                              int head_dim, int block_tokens, float* scratch);

struct AttentionKernels {
  const char* isa;  // "avx512", "avx2" or "generic" (portable vectors: SSE2 on x86, NEON on arm64)
  AttendTileFn attend_f32;
  AttendTileFn attend_f16;
  // IEEE halves of x[0..n), rounded to nearest even (the KV write path).
  void (*floats_to_halves)(const float* x, uint16_t* out, int n);

  AttendTileFn attend(KvType type) const { return type == KvType::F16 ? attend_f16 : attend_f32; }
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
