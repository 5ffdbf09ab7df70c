// Attention for the device backend (MLX's own kernels on the GPU, or on MLX's CPU device in
// tests): KV lives in MLX arrays indexed by the engine's block ids, new keys/values are
// scattered into their slots, and attention reads each sequence's keys from there.
//
// Why this shape: the engine's block pool, prefix cache and sessions stay exactly as on the
// CPU backend (block ids are the currency); only the storage moves to the device. Decode rows
// of many sequences share one padded attention call (masked when lengths differ) over their
// decode lanes (decode_lanes.h: each sequence's KV contiguous, written beside the block store
// and read in place); a prefill chunk gets its own causal call. A sequence whose slots are
// consecutive in the store (a lone sequence in a fresh pool, the common batch-1 case) is read
// in place through a slice, a view with no copy; otherwise its keys are gathered, a copy of its
// KV per layer. Sliding-window layers read rings of the same lanes, and a quantized store's
// lanes hold its dequantized rows (decode_lanes.h). RoPE is mx::fast::rope over the queries and keys together, one op per layer
// with each row's own position.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "../core/kv_cache.h"
#include "decode_lanes.h"
#include "paged_attention.h"
#include "rope.h"

namespace llmd {

namespace mx = mlx::core;

// Per layer: keys and values of every block slot, [slots, kv_heads * head_dim] (the layer's
// own KvShape entry; layers that store no KV have none) in the compute dtype (float16 on a
// GPU), slot = block * kBlockTokens + position in block. A sliding-window layer's arrays are
// indexed by the block's window slot instead (KvPool::window_slot), so they only grow with the
// window parts alive at once. With a quantized pool (KvType Q8_0 / Q4_0, --kv-type) keys and
// values hold GGML's codes instead (int8 [slots, width], or uint8 [slots, width / 2] with two
// 4-bit codes a byte in GGML's order) and the scales arrays the float16 scale of each 32
// numbers, [slots, width / 32]: the bytes llama.cpp's q8_0 / q4_0 KV takes. Attention
// dequantizes the rows it reads (kv_rows in device_attention.cpp).
class DeviceKvStore {
 public:
  // `counts` (owned by the caller, may be null) tallies the attention paths steps take.
  explicit DeviceKvStore(KvShape shape, AttentionPathCounts* counts = nullptr)
      : shape_(std::move(shape)), counts_(counts) {}
  // Grows storage (at least doubling) to cover every block id and window slot the pool has
  // handed out.
  void ensure(const KvPool& pool);
  // Every layer's slots of block `src` copied into block `dst`.
  void copy_block(const KvPool& pool, int src, int dst);
  // The disk tier's bytes of `blocks` (Model::read_kv_blocks): their full-attention layers, or
  // with `windowed` their window parts (by window slot). Inside a block, layer by layer: the
  // keys' 64 rows, the values', then (quantized types) the key scales' and the value scales',
  // each row as the store holds it; as many bytes as the pool counts for the part.
  void read_blocks(const KvPool& pool, const std::vector<int>& blocks, bool windowed,
                   const std::vector<std::byte*>& out);
  // The same bytes back into the store's rows of `blocks`.
  void write_blocks(const KvPool& pool, const std::vector<int>& blocks, bool windowed,
                    const std::vector<const std::byte*>& in);
  mx::array& keys(int layer) { return keys_[layer]; }
  mx::array& values(int layer) { return values_[layer]; }
  mx::array& key_scales(int layer) { return key_scales_[layer]; }
  mx::array& value_scales(int layer) { return value_scales_[layer]; }
  KvType type() const { return shape_.type; }
  AttentionPathCounts* counts() const { return counts_; }
  // The decode lanes (created on first use, once the store has its arrays).
  DecodeLanes* lanes();
  // The orthonormal Hadamard matrix of size n, float32 [n, n] (created on first use): quantized
  // KV stores keys and values rotated by it, as the CPU kernels do (core/hadamard.h).
  const mx::array& hadamard(int n);

 private:
  void grow(bool windowed, size_t& have, size_t need, size_t max);
  // The arrays of a part (read_blocks' order), and the store rows of `blocks` in them.
  std::vector<mx::array*> part_arrays(bool windowed);
  mx::array part_rows(const KvPool& pool, const std::vector<int>& blocks, bool windowed) const;
  // Throws unless a block's rows of the part are the bytes the pool counts for it.
  void check_part_bytes(const KvPool& pool, bool windowed);

  KvShape shape_;
  size_t blocks_ = 0;
  size_t window_slots_ = 0;
  std::vector<mx::array> keys_;
  std::vector<mx::array> values_;
  std::vector<mx::array> key_scales_;    // quantized types only
  std::vector<mx::array> value_scales_;
  AttentionPathCounts* counts_;
  std::unique_ptr<DecodeLanes> lanes_;
  std::map<int, mx::array> hadamard_;
};

// Index arrays of one step, built once on the host and shared by every layer.
struct DeviceAttentionPlan {
  mx::array write_slots{0};  // [rows] int32: the slot each row's k/v goes to
  mx::array positions{0};    // [rows] int32: each row's position, RoPE's offset
  mx::array rope_freqs{0.f};  // [dims / 2] float32: 1 / inv_freq, as mx::fast::rope takes them
  struct Group {
    int row0 = 0;
    int n_rows = 0;
    bool batched_decode = false;     // n_rows sequences of one token each
    int lanes = -1;                  // >= 0: read from decode lanes, lane_groups[lanes]
    mx::array gather{0};             // [L] (one sequence) or [n_rows, Lmax] (decode batch)
    int first_slot = -1;             // >= 0: one sequence's L slots are first_slot.. (read in place)
    // Bool, broadcast over the scores [batch, kv_heads, group, queries, keys]: [n_rows, 1, 1, 1,
    // Lmax] when decode lengths differ, [1, 1, 1, n_rows, L] for a windowed prefill chunk.
    std::optional<mx::array> mask;
  };
  std::vector<Group> groups;  // in row order, covering every row
  std::vector<DecodeLanes::Group> lane_groups;

  // Honours batch.window: sliding-window layers see only each query's window. With `kv`,
  // batched decode reads its lanes where it has them (they are kept up to date here, so every
  // layer of the step must then run device_attention with this plan) and the paths taken are
  // counted; without, it gathers. The lanes are planned once per step, by the plan of the
  // full-attention layers (window 0); a windowed plan of the same rows reads their rings when
  // given that plan as `lanes_of`, and gathers each query's window without it.
  static DeviceAttentionPlan build(const AttentionBatch& batch, const Rope& rope, DeviceKvStore* kv = nullptr,
                                   const DeviceAttentionPlan* lanes_of = nullptr);
};

// qkv: [rows, (n_heads + 2 * n_kv_heads) * head_dim] -> [rows, n_heads * head_dim], in
// qkv's dtype (the compute dtype, or float32 from a caller that keeps a float32 stream).
// As paged_attention: with `write_kv` false, qkv holds only the queries and `layer`'s KV is
// only read (KV sharing).
mx::array device_attention(const mx::array& qkv, const DeviceAttentionPlan& plan, int layer,
                           const AttentionShape& shape, const Rope& rope, DeviceKvStore& kv,
                           bool write_kv = true);

}  // namespace llmd
