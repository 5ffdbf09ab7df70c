// Key/value storage for all sequences, in fixed-size blocks of token positions.
//
// Why blocks: a sequence's KV grows token by token and sequences come and go; blocks keep
// allocation O(1), let memory be budgeted, and are the unit the prefix cache shares between
// sequences (vLLM's block pool idea). One block holds kBlockTokens positions of every layer
// (each layer's part of the block sized by its own KV shape: KvShape).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace llmd {

// Per-sequence recurrent state of a model with recurrent layers (Qwen3.5's gated delta-rule
// linear attention: a [heads, k_dim, v_dim] matrix and a short convolution window per layer),
// kept beside the KV of its other layers. Opaque to the engine: the model creates it on the
// sequence's first forward and replaces it every step; it always describes the sequence after
// exactly SequenceKv::length() positions. Copies must be independent of the original (a model
// that updates its arrays functionally, as MLX does, may share them).
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual std::unique_ptr<SequenceState> clone() const = 0;
  virtual size_t bytes() const = 0;
};

// The element type of stored keys and values. A property of the pool, not of a layer: every
// byte count (block_bytes, the budget's capacity) and every reader follows it. The CPU backend
// stores F16 by default (llama.cpp's default KV type too: half the memory of F32 per token, and
// attention reads half the bytes); F32 stays for tests and for the device backend's bookkeeping
// of its float32 arrays on MLX's CPU device. Q8_0 and Q4_0 (--kv-type) are GGML's blocks: 32
// numbers along head_dim share one float16 scale, 8 or 4 bits each, so a position costs what
// llama.cpp's -ctk/-ctv q8_0 / q4_0 cost (34 and 18 bytes per 32 numbers: kv_quant.h has the
// layout inside a block and the rounding).
enum class KvType { F32, F16, Q8_0, Q4_0 };

// Bytes that 32 stored numbers take (a quantization block of Q8_0/Q4_0, its scale included).
inline int kv_type_bytes_per_32(KvType t) {
  switch (t) {
    case KvType::F32:
      return 128;
    case KvType::F16:
      return 64;
    case KvType::Q8_0:
      return 34;
    case KvType::Q4_0:
      return 18;
  }
  return 0;
}
inline bool kv_type_quantized(KvType t) { return t == KvType::Q8_0 || t == KvType::Q4_0; }
inline const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32:
      return "f32";
    case KvType::F16:
      return "f16";
    case KvType::Q8_0:
      return "q8_0";
    case KvType::Q4_0:
      return "q4_0";
  }
  return "?";
}
// "f32", "f16", "q8_0", "q4_0"; throws std::invalid_argument naming the choices otherwise.
KvType kv_type_named(const std::string& name);

struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  // Where the KV numbers live. The CPU backend keeps blocks of `type` here in host memory; a
  // device backend keeps its own storage (indexed by the same block ids, of its own dtype,
  // which `type` then only describes for the budget) and this pool only does the bookkeeping:
  // allocation, sharing, budget and LRU eviction.
  bool host_storage = true;
  KvType type = KvType::F16;
  // Bytes of n stored numbers (n a multiple of 32; every head's part of a block is).
  size_t bytes_of(size_t n) const { return n / 32 * kv_type_bytes_per_32(type); }
  // Layers of different shapes (Gemma 4: full-attention layers have their own head size and
  // KV-head count): one entry per layer, or empty when every layer has n_kv_heads x head_dim.
  // A layer with 0 KV heads stores nothing (it reads an earlier layer's KV: KV sharing).
  std::vector<int> layer_kv_heads;
  std::vector<int> layer_head_dim;

  int kv_heads_of(int layer) const { return layer_kv_heads.empty() ? n_kv_heads : layer_kv_heads[layer]; }
  int head_dim_of(int layer) const { return layer_head_dim.empty() ? head_dim : layer_head_dim[layer]; }
  // Numbers (keys and values) one position stores in one layer.
  size_t layer_elements(int layer) const { return size_t{2} * kv_heads_of(layer) * head_dim_of(layer); }
  // Sliding-window layers (windowed[layer]; empty: none) attend to the last `window` positions
  // only, so their part of a block is kept only while some sequence's window covers it (see
  // "Window parts" below): their memory is bounded by the window, not the context.
  int window = 0;
  std::vector<bool> windowed;

  bool is_windowed(int layer) const { return window > 0 && !windowed.empty() && windowed[layer]; }
  int windowed_layers() const;
};

// Window parts: a block's sliding-window layers live in a separate "window part" (its own id,
// window_slot(block), so a device backend indexes its windowed layers' storage by it). A
// sequence holds the window part of each of its blocks until the block falls behind its window
// (plus kWindowMarginBlocks, so a conversation resumed a little before where it stopped still
// finds its window); the last holder to move past it frees the part. A sequence that ends lets
// go of its holds without freeing, so the tail of a finished conversation keeps its window for
// the prefix cache. The prefix cache reuses a prefix only if the window before its end still
// exists (has_window_for).
class KvPool {
 public:
  static constexpr int kBlockTokens = 64;
  static constexpr int kWindowMarginBlocks = 2;

  KvPool(KvShape shape, size_t budget_bytes);

  const KvShape& shape() const { return shape_; }
  // Bytes of a block's full-attention layers, and of its window part (0 without windows).
  size_t block_bytes() const { return shape_.bytes_of(block_elements_); }
  size_t window_part_bytes() const { return shape_.bytes_of(window_elements_); }
  // Bytes one more position of context costs (every layer, windowed ones included), and the
  // positions the budget holds in full blocks: what the KV type buys a user.
  size_t bytes_per_token() const { return (block_bytes() + window_part_bytes()) / kBlockTokens; }
  size_t capacity_tokens() const { return max_blocks_ * kBlockTokens; }
  // Upper bounds on block ids and window slots the budget allows.
  size_t capacity_blocks() const { return max_blocks_; }
  size_t capacity_window_slots() const { return max_window_slots_; }
  size_t used_blocks() const { return used_; }            // referenced by sequences
  size_t cached_idle_blocks() const { return idle_.size(); }  // kept only for reuse
  // Blocks and window parts created (less retired ones, below) and the extra bytes claimed.
  size_t allocated_bytes() const {
    return (created_ - retired_.size()) * block_bytes() + window_created_ * window_part_bytes() + extra_bytes_;
  }
  // Bytes a backend holds beside the blocks for the same KV (the device path's decode lanes,
  // native/mlx/decode_lanes.h), counted in allocated_bytes() and so in the budget: raising the
  // claim to `bytes` evicts idle cached blocks and retires free ones (not handed out until the
  // claim shrinks again), and fails, changing nothing, when blocks in use leave no room. Why
  // retire rather than only fill the headroom: a long-running server's prefix cache keeps the
  // budget full of idle blocks, which then would refuse the lanes for good.
  bool claim_extra(size_t bytes);
  size_t extra_bytes() const { return extra_bytes_; }
  // Called when a block cannot be had while extra bytes are claimed: the holder gives them up
  // (claim_extra(0)), as lanes can be rebuilt from the blocks, and the allocation is retried.
  // Blocks in use come first. Set by the holder, which the pool must not outlive (the engine's
  // model outlives its pool).
  void set_extra_release(std::function<void()> release) { release_extra_ = std::move(release); }
  // Block ids handed out so far run from 0 to created_blocks() - 1; window slots likewise.
  size_t created_blocks() const { return created_; }
  size_t created_window_slots() const { return window_created_; }
  size_t live_window_parts() const { return window_created_ - window_free_.size(); }

  // Returns a block id with one reference (and a window part held once, when the model has
  // windowed layers), or -1 if the budget is exhausted even after evicting least recently
  // used idle cached blocks.
  int allocate();
  void retain(int block);
  void release(int block);
  // Copies every layer's keys and values of block `src` into block `dst` (host storage only;
  // a device backend copies its own storage: Model::copy_kv_block).
  void copy_block(int src, int dst);

  // Window parts (see above). window_slot: -1 when the block has none.
  int window_slot(int block) const { return shape_.window > 0 ? window_slot_[block] : -1; }
  bool has_window_part(int block) const { return shape_.window <= 0 || window_slot_[block] >= 0; }
  void hold_window(int block) { ++window_holds_[block]; }
  // `drop`: the holder moved past the block's window (the part is freed when no one else
  // holds it); otherwise the holder ended and the part is kept.
  void unhold_window(int block, bool drop);
  // Whether a sequence continuing at position `length` on `blocks` has its whole window.
  bool has_window_for(const std::vector<int>& blocks, int length) const;
  // Index of the first block a sequence at `length` positions still needs for its window,
  // keeping `margin_blocks` more before it.
  int first_window_block(int length, int margin_blocks) const;

  // Blocks marked cacheable stay allocated after their last reference is released (idle, in
  // LRU order) until memory is needed; `on_evict` is told before an idle block is reused.
  void mark_cacheable(int block);
  bool is_cacheable(int block) const { return cacheable_[block]; }
  bool referenced(int block) const { return refs_[block] > 0; }
  void set_evict_callback(std::function<void(int)> on_evict) { on_evict_ = std::move(on_evict); }

  // One head of one layer in a block (the layer's own head_dim: KvShape::head_dim_of), in
  // shape().type (uint16_t bits for F16, float for F32; kv_quant.h's planes for Q8_0/Q4_0).
  // Keys are stored transposed, [head_dim][kBlockTokens], so attention scores 8 or 16
  // positions per vector op without horizontal sums; values are [kBlockTokens][head_dim].
  // Blocks and every head's part are 64-byte aligned. Host storage only (shape().host_storage).
  void* keys(int block, int layer, int head) { return at(block, layer, 0, head); }
  void* values(int block, int layer, int head) { return at(block, layer, 1, head); }
  // Every byte of a block's full-attention layers (block_bytes() of them), as the disk tier
  // writes and reads them back. Host storage only.
  std::byte* block_data(int block) { return storage_[block].get(); }
  // Every byte of a block's window part (window_part_bytes()), null when it has none; and a
  // window part held by no one given to a block that has none (KV loaded from disk: kept for
  // the prefix cache like a finished sequence's), false when the budget has no room. Host
  // storage only.
  std::byte* window_data(int block) {
    return window_slot(block) >= 0 ? window_storage_[window_slot_[block]].get() : nullptr;
  }
  bool attach_window_part(int block);
  // A block's full-attention part or its window part, as the disk tier moves them. Host storage only.
  std::byte* part_data(int block, bool window) { return window ? window_data(block) : block_data(block); }
  size_t part_bytes(bool window) const { return window ? window_part_bytes() : block_bytes(); }

 private:
  void* at(int block, int layer, int kv, int head) {
    const size_t off = layer_offset_[layer] + (static_cast<size_t>(kv) * shape_.kv_heads_of(layer) + head) *
                                                   kBlockTokens * shape_.head_dim_of(layer);
    std::byte* base = shape_.is_windowed(layer) ? window_storage_[window_slot_[block]].get() : storage_[block].get();
    return base + shape_.bytes_of(off);
  }
  bool evict_one();       // the least recently used idle block back to free_; false if none
  int take_window_slot();  // -1 when the budget has no room even after evictions
  void free_window_part(int block);

  KvShape shape_;
  size_t budget_bytes_;
  // First element of each layer in its part of a block (the full part, or the window part for
  // windowed layers).
  std::vector<size_t> layer_offset_;
  size_t block_elements_;
  size_t window_elements_ = 0;
  size_t max_blocks_;
  size_t max_window_slots_ = 0;
  size_t used_ = 0;
  size_t created_ = 0;
  struct AlignedFree {
    void operator()(std::byte* p) const;
  };
  std::vector<std::unique_ptr<std::byte[], AlignedFree>> storage_;
  std::vector<std::unique_ptr<std::byte[], AlignedFree>> window_storage_;
  std::vector<int> window_slot_;   // per block
  std::vector<int> window_holds_;  // per block
  std::vector<int> window_free_;
  size_t window_created_ = 0;
  std::vector<int> free_;
  std::vector<int> refs_;
  std::vector<bool> cacheable_;
  std::list<int> idle_;  // cacheable blocks with no reference, least recently used first
  std::vector<std::list<int>::iterator> idle_pos_;
  std::function<void(int)> on_evict_;
  int allocate_once();
  size_t extra_bytes_ = 0;
  std::function<void()> release_extra_;
  std::vector<int> retired_;  // free block ids set aside for the extra bytes
};

// The KV positions owned by one sequence: its blocks, in order, and how many positions hold data.
class SequenceKv {
 public:
  explicit SequenceKv(KvPool& pool) : pool_(&pool) {}
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  int length() const { return length_; }
  const std::vector<int>& blocks() const { return blocks_; }

  // Makes room for positions up to `new_length`; false if the pool is out of budget.
  bool reserve(int new_length);
  // Starts the sequence on shared, already filled blocks (a cached prefix; their window parts
  // must exist: KvPool::has_window_for).
  void adopt(const std::vector<int>& blocks, int length);
  // Records that positions [0, n) hold data; window parts the sequence no longer needs go.
  void set_length(int n);
  // Takes its own copy of block `src` as the block holding position length - 1 (after whole
  // blocks it already has) and `length` positions: a cached block's shared head, a forking
  // parent's partly filled last block. `copy(src, dst)` copies one block's KV in the model's
  // storage (Model::copy_kv_block). `src` is held meanwhile, so that allocating the new block
  // cannot evict it. False when the budget has no room (the length is then unchanged).
  bool copy_head(int src, int length, const std::function<void(int src, int dst)>& copy);
  // Releases the blocks and drops the recurrent state.
  void clear();

  // Models with recurrent layers (Model::has_recurrent_state): the state after length()
  // positions (null before the first forward), owned by the sequence and freed with it.
  std::unique_ptr<SequenceState> state;
  // Copies of the state the model recorded during the last forward at the positions the step
  // asked for (StepSegment::snapshot_at); the engine takes them after the step.
  std::vector<std::pair<int, std::shared_ptr<const SequenceState>>> snapshots;

 private:
  KvPool* pool_;
  std::vector<int> blocks_;
  int length_ = 0;
  int window_from_ = 0;  // blocks before this index no longer hold their window part
};

}  // namespace llmd
