// Attention over the paged KV cache on the GPU: RoPE and the KV write fused into one kernel,
// and attention kernels that read the KV blocks where they are (through each sequence's block
// table), never gathering a sequence's KV into a contiguous copy. Why: on MLX's CUDA backend the
// per-sequence KV gathers took 870 us of a ~10 ms decode step at batch 1 and 8.6 ms of a 20.8 ms
// step at batch 32, and RoPE / the KV scatter were a dozen launch-bound elementwise ops per layer
// (bench/README.md). The block ids are the engine's own (core/kv_cache.h: KvPool), so the prefix
// cache, forks and sessions work on the GPU exactly as on the CPU.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace llmd::cuda {

// Positions per KV block: the engine's KvPool::kBlockTokens.
inline constexpr int kKvBlockTokens = 64;

// One layer's KV storage on the device, indexed by the engine's block ids:
// k and v are each [num_blocks][n_kv_heads][kKvBlockTokens][head_dim] float16.
struct LayerKv {
  __half* k = nullptr;
  __half* v = nullptr;
  int num_blocks = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
};

// Rotary embedding: the first `dims` of each head's head_dim values rotate (dims <= head_dim,
// partial rotary leaves the rest as they are) by position * inv_freq[i], i < dims / 2.
// interleaved: pairs are (x[2i], x[2i+1]) (GGUF llama, whose Q/K weights were permuted for it);
// otherwise (x[i], x[i + dims/2]) (NeoX style: qwen2, qwen3, gemma).
struct Rope {
  const float* inv_freq = nullptr;  // device, dims / 2 values
  int dims = 0;
  bool interleaved = true;
};

// For each of `rows` new tokens, qkv[row] holds q (n_heads * head_dim values), then k and v
// (n_kv_heads * head_dim each), row stride ld. Rotates q in place and k by positions[row], and
// writes k and v as float16 into KV slot slots[row] (= block_id * kKvBlockTokens + offset).
// positions and slots are device arrays.
void rope_write_kv(float* qkv, int ld, int rows, int n_heads, const int32_t* positions, const int32_t* slots,
                   const Rope& rope, const LayerKv& kv, cudaStream_t stream);

// The sequences of one step. Sequence s owns query rows [q_start[s], q_start[s+1]) of q; its
// first query row sits at position q_pos0[s] and row i attends causally to positions
// [0, q_pos0[s] + i], read through block_table[s * max_blocks_per_seq + j] (the block holding
// positions [64 j, 64 j + 63]). All pointers are device arrays. The launch configuration may
// depend only on the host-side ints below, never on the device arrays' contents, so a decode
// step captured once in a CUDA graph replays correctly as its sequences grow.
struct AttentionBatch {
  int num_seqs = 0;
  int total_q_rows = 0;
  int max_q_rows = 0;          // the most query rows of any sequence (1: a pure decode step)
  int max_blocks_per_seq = 0;  // the block table's row length: bounds every sequence's length
  const int32_t* q_start = nullptr;  // [num_seqs + 1]
  const int32_t* q_pos0 = nullptr;   // [num_seqs]
  const int32_t* block_table = nullptr;  // [num_seqs][max_blocks_per_seq]
};

// out[row] (n_heads * head_dim float32, row stride ld_out) = softmax(q k^T * scale) v for every
// query row, GQA (head h reads KV head h / (n_heads / n_kv_heads)). q: the first n_heads *
// head_dim values of each qkv row (stride ld_q), already rotated by rope_write_kv, whose KV
// writes for this step's tokens must come first (same stream). The workspace holds split
// partial results of long decode rows (flash-decoding); attention_workspace_bytes sizes it.
size_t attention_workspace_bytes(const AttentionBatch& batch, int n_heads, int head_dim);
void paged_attention(const float* q, int ld_q, const AttentionBatch& batch, const LayerKv& kv, int n_heads,
                     float scale, float* out, int ld_out, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);

// Which kernel paged_attention runs for this batch ("decode_split", "prefill_flash_mma", ...),
// for the engine's attention_paths report.
const char* attention_path(const AttentionBatch& batch, int head_dim);

}  // namespace llmd::cuda
