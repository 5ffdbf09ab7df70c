// Key/value storage for all sequences, in fixed-size blocks of token positions.
//
// Why blocks: a sequence's KV grows token by token and sequences come and go; blocks keep
// allocation O(1), let memory be budgeted, and are the unit the prefix cache shares between
// sequences (vLLM's block pool idea). One block holds kBlockTokens positions of every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
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

struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  // Where the KV numbers live. The CPU backend keeps float32 blocks here in host memory; a
  // device backend keeps its own storage (indexed by the same block ids) and this pool only
  // does the bookkeeping: allocation, sharing, budget and LRU eviction.
  bool host_storage = true;
  int element_bytes = 4;
};

class KvPool {
 public:
  static constexpr int kBlockTokens = 64;

  KvPool(KvShape shape, size_t budget_bytes);

  const KvShape& shape() const { return shape_; }
  size_t block_bytes() const { return block_floats_ * shape_.element_bytes; }
  size_t capacity_blocks() const { return max_blocks_; }
  size_t used_blocks() const { return used_; }            // referenced by sequences
  size_t cached_idle_blocks() const { return idle_.size(); }  // kept only for reuse
  size_t allocated_bytes() const { return created_ * block_bytes(); }
  // Block ids handed out so far run from 0 to created_blocks() - 1.
  size_t created_blocks() const { return created_; }

  // Returns a block id with one reference, or -1 if the budget is exhausted even after
  // evicting the least recently used idle cached block.
  int allocate();
  void retain(int block);
  void release(int block);
  // Copies every layer's keys and values of block `src` into block `dst` (host storage only;
  // a device backend copies its own storage: Model::copy_kv_block).
  void copy_block(int src, int dst);

  // Blocks marked cacheable stay allocated after their last reference is released (idle, in
  // LRU order) until memory is needed; `on_evict` is told before an idle block is reused.
  void mark_cacheable(int block);
  bool is_cacheable(int block) const { return cacheable_[block]; }
  bool referenced(int block) const { return refs_[block] > 0; }
  void set_evict_callback(std::function<void(int)> on_evict) { on_evict_ = std::move(on_evict); }

  // One head of one layer in a block. Keys are stored transposed, [head_dim][kBlockTokens],
  // so attention scores 16 positions per vector op without horizontal sums; values are
  // [kBlockTokens][head_dim]. Blocks are 64-byte aligned.
  // Host storage only (shape().host_storage).
  float* keys(int block, int layer, int head) { return at(block, layer, 0, head); }
  float* values(int block, int layer, int head) { return at(block, layer, 1, head); }

 private:
  float* at(int block, int layer, int kv, int head) {
    const size_t off = ((static_cast<size_t>(layer) * 2 + kv) * shape_.n_kv_heads + head) *
                       kBlockTokens * shape_.head_dim;
    return storage_[block].get() + off;
  }

  KvShape shape_;
  size_t block_floats_;
  size_t max_blocks_;
  size_t used_ = 0;
  size_t created_ = 0;
  struct AlignedFree {
    void operator()(float* p) const;
  };
  std::vector<std::unique_ptr<float[], AlignedFree>> storage_;
  std::vector<int> free_;
  std::vector<int> refs_;
  std::vector<bool> cacheable_;
  std::list<int> idle_;  // cacheable blocks with no reference, least recently used first
  std::vector<std::list<int>::iterator> idle_pos_;
  std::function<void(int)> on_evict_;
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
  // Starts the sequence on shared, already filled blocks (a cached prefix).
  void adopt(const std::vector<int>& blocks, int length);
  void set_length(int n) { length_ = n; }
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
};

}  // namespace llmd
