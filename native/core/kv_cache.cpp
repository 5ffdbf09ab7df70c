#include "kv_cache.h"

#include <cstdlib>
#include <new>

namespace llmd {

KvPool::KvPool(KvShape shape, size_t budget_bytes)
    : shape_(shape),
      block_floats_(static_cast<size_t>(shape.n_layers) * 2 * shape.n_kv_heads * kBlockTokens *
                    shape.head_dim) {
  max_blocks_ = budget_bytes / block_bytes();
  if (max_blocks_ == 0) max_blocks_ = 1;
}

int KvPool::allocate() {
  if (!free_.empty()) {
    const int b = free_.back();
    free_.pop_back();
    ++used_;
    return b;
  }
  if (storage_.size() >= max_blocks_) return -1;
  void* p = std::aligned_alloc(64, (block_bytes() + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  storage_.emplace_back(static_cast<float*>(p));
  ++used_;
  return static_cast<int>(storage_.size()) - 1;
}

void KvPool::release(int block) {
  free_.push_back(block);
  --used_;
}

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

void SequenceKv::clear() {
  for (int b : blocks_) pool_->release(b);
  blocks_.clear();
  length_ = 0;
}

}  // namespace llmd
