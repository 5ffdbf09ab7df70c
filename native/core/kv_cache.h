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
#include <vector>

namespace llmd {

struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  // Where the KV numbers live. The CPU backend keeps float32 blocks here in host memory; a
  // device backend keeps its own storage (indexed by the same block ids) and this pool only
  // does the bookkeeping: allocation, sharing, budget and LRU eviction.
  bool host_storage = true;
  int element_bytes = 4;
  // Layers of different shapes (Gemma 4: full-attention layers have their own head size and
  // KV-head count): one entry per layer, or empty when every layer has n_kv_heads x head_dim.
  // A layer with 0 KV heads stores nothing (it reads an earlier layer's KV: KV sharing).
  std::vector<int> layer_kv_heads;
  std::vector<int> layer_head_dim;

  int kv_heads_of(int layer) const { return layer_kv_heads.empty() ? n_kv_heads : layer_kv_heads[layer]; }
  int head_dim_of(int layer) const { return layer_head_dim.empty() ? head_dim : layer_head_dim[layer]; }
  // Numbers (keys and values) one position stores in one layer.
  size_t layer_elements(int layer) const { return size_t{2} * kv_heads_of(layer) * head_dim_of(layer); }
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
  void set_evict_callback(std::function<void(int)> on_evict) { on_evict_ = std::move(on_evict); }

  // One head of one layer in a block (the layer's own head_dim: KvShape::head_dim_of). Keys
  // are stored transposed, [head_dim][kBlockTokens],
  // so attention scores 16 positions per vector op without horizontal sums; values are
  // [kBlockTokens][head_dim]. Blocks are 64-byte aligned.
  // Host storage only (shape().host_storage).
  float* keys(int block, int layer, int head) { return at(block, layer, 0, head); }
  float* values(int block, int layer, int head) { return at(block, layer, 1, head); }

 private:
  float* at(int block, int layer, int kv, int head) {
    const size_t off = layer_offset_[layer] + (static_cast<size_t>(kv) * shape_.kv_heads_of(layer) + head) *
                                                   kBlockTokens * shape_.head_dim_of(layer);
    return storage_[block].get() + off;
  }

  KvShape shape_;
  std::vector<size_t> layer_offset_;  // first float of each layer in a block
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
  void clear();

 private:
  KvPool* pool_;
  std::vector<int> blocks_;
  int length_ = 0;
};

}  // namespace llmd
