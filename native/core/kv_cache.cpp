#include "kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace llmd {

KvPool::KvPool(KvShape shape, size_t budget_bytes) : shape_(std::move(shape)), block_floats_(0) {
  if ((!shape_.layer_kv_heads.empty() && static_cast<int>(shape_.layer_kv_heads.size()) != shape_.n_layers) ||
      shape_.layer_kv_heads.size() != shape_.layer_head_dim.size()) {
    throw std::invalid_argument("KvShape: per-layer KV shapes must name every layer");
  }
  for (int l = 0; l < shape_.n_layers; ++l) {
    layer_offset_.push_back(block_floats_);
    block_floats_ += shape_.layer_elements(l) * kBlockTokens;
  }
  if (block_floats_ == 0) throw std::invalid_argument("KvShape: no layer stores KV");
  max_blocks_ = budget_bytes / block_bytes();
  if (max_blocks_ == 0) max_blocks_ = 1;
}

int KvPool::allocate() {
  int b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (created_ < max_blocks_) {
    if (shape_.host_storage) {
      void* p = std::aligned_alloc(64, (block_bytes() + 63) / 64 * 64);
      if (!p) throw std::bad_alloc();
      storage_.emplace_back(static_cast<float*>(p));
    }
    refs_.push_back(0);
    cacheable_.push_back(false);
    idle_pos_.emplace_back();
    b = static_cast<int>(created_++);
  } else if (!idle_.empty()) {
    b = idle_.front();
    idle_.pop_front();
    if (on_evict_) on_evict_(b);
    cacheable_[b] = false;
  } else {
    return -1;
  }
  refs_[b] = 1;
  ++used_;
  return b;
}

void KvPool::retain(int block) {
  if (refs_[block]++ == 0) {
    idle_.erase(idle_pos_[block]);  // a reused idle cached block
    ++used_;
  }
}

void KvPool::release(int block) {
  if (--refs_[block] > 0) return;
  --used_;
  if (cacheable_[block]) {
    idle_.push_back(block);
    idle_pos_[block] = std::prev(idle_.end());
  } else {
    free_.push_back(block);
  }
}

void KvPool::copy_block(int src, int dst) {
  std::memcpy(storage_[dst].get(), storage_[src].get(), block_bytes());
}

void KvPool::mark_cacheable(int block) { cacheable_[block] = true; }

void KvPool::AlignedFree::operator()(float* p) const { std::free(p); }

SequenceKv::~SequenceKv() { clear(); }

bool SequenceKv::reserve(int new_length) {
  const size_t need = (static_cast<size_t>(new_length) + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens;
  while (blocks_.size() < need) {
    const int b = pool_->allocate();
    if (b < 0) return false;
    blocks_.push_back(b);
  }
  return true;
}

void SequenceKv::adopt(const std::vector<int>& blocks, int length) {
  clear();
  for (int b : blocks) pool_->retain(b);
  blocks_ = blocks;
  length_ = length;
}

void SequenceKv::clear() {
  for (int b : blocks_) pool_->release(b);
  blocks_.clear();
  length_ = 0;
}

}  // namespace llmd
