#include "kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace llmd {

namespace {
constexpr size_t kMinBlockBookkeeping = 1024;  // bytes charged per block id when no layer is full

std::byte* aligned_bytes(size_t bytes) {
  void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  if (!p) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}
}  // namespace

KvType kv_type_named(const std::string& name) {
  for (KvType t : {KvType::F16, KvType::Q8_0, KvType::Q4_0, KvType::F32}) {
    if (name == kv_type_name(t)) return t;
  }
  throw std::invalid_argument("unknown KV type '" + name + "': choose f16, q8_0 or q4_0");
}

int KvShape::windowed_layers() const {
  int n = 0;
  for (int l = 0; l < n_layers; ++l) n += is_windowed(l) ? 1 : 0;
  return n;
}

KvPool::KvPool(KvShape shape, size_t budget_bytes)
    : shape_(std::move(shape)), budget_bytes_(budget_bytes), block_elements_(0) {
  if ((!shape_.layer_kv_heads.empty() && static_cast<int>(shape_.layer_kv_heads.size()) != shape_.n_layers) ||
      shape_.layer_kv_heads.size() != shape_.layer_head_dim.size()) {
    throw std::invalid_argument("KvShape: per-layer KV shapes must name every layer");
  }
  for (int l = 0; l < shape_.n_layers; ++l) {
    // A quantization block is 32 numbers of one position along head_dim.
    if (kv_type_quantized(shape_.type) && shape_.kv_heads_of(l) > 0 && shape_.head_dim_of(l) % 32 != 0) {
      throw std::invalid_argument(std::string("KV type ") + kv_type_name(shape_.type) + " needs a head size that is a " +
                                  "multiple of 32; layer " + std::to_string(l) + " has " +
                                  std::to_string(shape_.head_dim_of(l)) + " (use --kv-type f16)");
    }
    size_t& part = shape_.is_windowed(l) ? window_elements_ : block_elements_;
    layer_offset_.push_back(part);
    part += shape_.layer_elements(l) * kBlockTokens;
  }
  if (block_elements_ == 0 && window_elements_ == 0) throw std::invalid_argument("KvShape: no layer stores KV");
  if (window_elements_ == 0) shape_.window = 0;
  max_blocks_ = budget_bytes / std::max(block_bytes(), window_elements_ > 0 ? kMinBlockBookkeeping : size_t{1});
  if (max_blocks_ == 0) max_blocks_ = 1;
  if (window_elements_ > 0) {
    // s window parts need s blocks: s * (block + part) <= budget.
    max_window_slots_ = std::max<size_t>(1, budget_bytes / (block_bytes() + window_part_bytes()));
  }
}

bool KvPool::evict_one() {
  if (idle_.empty()) return false;
  const int b = idle_.front();
  idle_.pop_front();
  if (on_evict_) on_evict_(b);
  cacheable_[b] = false;
  free_window_part(b);
  free_.push_back(b);
  return true;
}

int KvPool::take_window_slot() {
  for (;;) {
    if (!window_free_.empty()) {
      const int s = window_free_.back();
      window_free_.pop_back();
      return s;
    }
    if (window_created_ < max_window_slots_ && allocated_bytes() + window_part_bytes() <= budget_bytes_) {
      if (shape_.host_storage) window_storage_.emplace_back(aligned_bytes(window_part_bytes()));
      return static_cast<int>(window_created_++);
    }
    if (!evict_one()) return -1;
  }
}

void KvPool::free_window_part(int block) {
  if (window_elements_ == 0 || window_slot_[block] < 0) return;
  window_free_.push_back(window_slot_[block]);
  window_slot_[block] = -1;
  window_holds_[block] = 0;
}

int KvPool::allocate() {
  int b = allocate_once();
  if (b < 0 && extra_bytes_ > 0 && release_extra_) {
    release_extra_();
    b = allocate_once();
  }
  return b;
}

int KvPool::allocate_once() {
  int b = -1;
  const bool room_for_part = window_elements_ == 0 || !window_free_.empty() ||
                             allocated_bytes() + block_bytes() + window_part_bytes() <= budget_bytes_;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (created_ < max_blocks_ && room_for_part &&
             (extra_bytes_ == 0 || allocated_bytes() + block_bytes() <= budget_bytes_)) {
    if (shape_.host_storage) storage_.emplace_back(aligned_bytes(block_bytes()));
    refs_.push_back(0);
    cacheable_.push_back(false);
    idle_pos_.emplace_back();
    window_slot_.push_back(-1);
    window_holds_.push_back(0);
    b = static_cast<int>(created_++);
  } else if (evict_one()) {
    b = free_.back();
    free_.pop_back();
  } else {
    return -1;
  }
  if (window_elements_ > 0) {
    const int slot = take_window_slot();
    if (slot < 0) {
      free_.push_back(b);
      return -1;
    }
    window_slot_[b] = slot;
    window_holds_[b] = 1;
  }
  refs_[b] = 1;
  ++used_;
  return b;
}

bool KvPool::claim_extra(size_t bytes) {
  const size_t blocks_bytes = allocated_bytes() - extra_bytes_;
  if (bytes <= extra_bytes_) {
    extra_bytes_ = bytes;
    while (!retired_.empty() && allocated_bytes() + block_bytes() <= budget_bytes_) {
      free_.push_back(retired_.back());
      retired_.pop_back();
    }
    return true;
  }
  if (blocks_bytes + bytes > budget_bytes_) {
    // Only free and idle blocks can make room: check first, so a refused claim evicts nothing.
    const size_t short_by = blocks_bytes + bytes - budget_bytes_;
    const size_t spare = (free_.size() + idle_.size()) * block_bytes();
    if (block_bytes() == 0 || spare < short_by) return false;
  }
  while (allocated_bytes() - extra_bytes_ + bytes > budget_bytes_) {
    if (free_.empty()) evict_one();
    retired_.push_back(free_.back());
    free_.pop_back();
  }
  extra_bytes_ = bytes;
  return true;
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
    free_window_part(block);
    free_.push_back(block);
  }
}

bool KvPool::attach_window_part(int block) {
  if (window_elements_ == 0 || window_slot_[block] >= 0) return true;
  const int slot = take_window_slot();
  if (slot < 0) return false;
  window_slot_[block] = slot;
  window_holds_[block] = 0;
  return true;
}

void KvPool::copy_block(int src, int dst) {
  if (block_elements_ > 0) std::memcpy(storage_[dst].get(), storage_[src].get(), block_bytes());
  if (window_elements_ > 0) {
    std::memcpy(window_storage_[window_slot_[dst]].get(), window_storage_[window_slot_[src]].get(),
                window_part_bytes());
  }
}

void KvPool::mark_cacheable(int block) { cacheable_[block] = true; }

void KvPool::unhold_window(int block, bool drop) {
  if (window_elements_ == 0 || window_slot_[block] < 0) return;
  if (--window_holds_[block] > 0) return;
  window_holds_[block] = 0;
  if (drop) free_window_part(block);
}

int KvPool::first_window_block(int length, int margin_blocks) const {
  if (shape_.window <= 0) return 0;
  // The next query (at position `length`) sees positions length - window + 1 .. length.
  const int first_kept = length - shape_.window + 1 - margin_blocks * kBlockTokens;
  return first_kept <= 0 ? 0 : first_kept / kBlockTokens;
}

bool KvPool::has_window_for(const std::vector<int>& blocks, int length) const {
  if (shape_.window <= 0) return true;
  const int end = std::min<int>(static_cast<int>(blocks.size()), (length + kBlockTokens - 1) / kBlockTokens);
  for (int i = first_window_block(length, 0); i < end; ++i) {
    if (!has_window_part(blocks[i])) return false;
  }
  return true;
}

void KvPool::AlignedFree::operator()(std::byte* p) const { std::free(p); }

SequenceKv::~SequenceKv() { clear(); }

bool SequenceKv::reserve(int new_length) {
  const size_t need = (static_cast<size_t>(new_length) + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens;
  while (blocks_.size() < need) {
    const int b = pool_->allocate();  // holds its window part once: this sequence's hold
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
  if (pool_->shape().window <= 0) return;
  // Hold the window parts from where this sequence's window (with margin) starts, as far
  // back as they still exist (at least the strict window: the caller checked has_window_for).
  int from = static_cast<int>(blocks_.size());
  const int lowest = pool_->first_window_block(length, KvPool::kWindowMarginBlocks);
  while (from > lowest && pool_->has_window_part(blocks_[from - 1])) --from;
  window_from_ = from;
  for (size_t i = window_from_; i < blocks_.size(); ++i) pool_->hold_window(blocks_[i]);
}

bool SequenceKv::copy_head(int src, int length, const std::function<void(int src, int dst)>& copy) {
  pool_->retain(src);
  const bool room = reserve(length);
  if (room) {
    copy(src, blocks_[(length - 1) / KvPool::kBlockTokens]);
    set_length(length);
  }
  pool_->release(src);
  return room;
}

void SequenceKv::set_length(int n) {
  length_ = n;
  const int keep_from = pool_->first_window_block(n, KvPool::kWindowMarginBlocks);
  while (window_from_ < keep_from && window_from_ < static_cast<int>(blocks_.size())) {
    pool_->unhold_window(blocks_[window_from_++], /*drop=*/true);
  }
}

void SequenceKv::clear() {
  for (size_t i = window_from_; i < blocks_.size(); ++i) pool_->unhold_window(blocks_[i], /*drop=*/false);
  for (int b : blocks_) pool_->release(b);
  blocks_.clear();
  length_ = 0;
  window_from_ = 0;
  state.reset();
  snapshots.clear();
}

}  // namespace llmd
