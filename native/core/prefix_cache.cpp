#include "prefix_cache.h"

#include <algorithm>
#include <cstdint>

namespace llmd {

namespace {
uint64_t mix(uint64_t h) {  // splitmix64 finaliser
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}
}  // namespace

PrefixCache::PrefixCache(KvPool& pool) : pool_(pool) {
  pool_.set_evict_callback([this](int block) { forget(block); });
}

uint64_t PrefixCache::chain(uint64_t parent, const int32_t* tokens) {
  uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < KvPool::kBlockTokens; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
  return h;
}

uint64_t PrefixCache::child_slot(uint64_t parent, const int32_t* tokens) {
  uint64_t h = mix(parent ^ 0x632be59bd9b4e019ULL);
  for (int i = 0; i < kMinPartialTokens; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
  return h;
}

PrefixCache::Match PrefixCache::match(const int32_t* tokens, int max_tokens) const {
  Match m;
  uint64_t parent = 0;
  int start = 0;
  for (; start + KvPool::kBlockTokens <= max_tokens; start += KvPool::kBlockTokens) {
    const uint64_t key = chain(parent, tokens + start);
    auto it = by_key_.find(key);
    if (it == by_key_.end() || it->second.parent != parent || it->second.n_tokens != KvPool::kBlockTokens ||
        !std::equal(it->second.tokens.begin(), it->second.tokens.end(), tokens + start)) {
      break;
    }
    m.blocks.push_back(it->second.block);
    m.keys.push_back(key);
    parent = key;
  }
  const int rest = std::min(max_tokens - start, KvPool::kBlockTokens);
  if (rest < kMinPartialTokens) return m;
  auto [first, last] = children_.equal_range(child_slot(parent, tokens + start));
  for (auto it = first; it != last; ++it) {
    const auto e = by_key_.find(it->second);
    if (e == by_key_.end() || e->second.parent != parent) continue;
    const auto& cached = e->second.tokens;
    const int n = std::min(rest, e->second.n_tokens);
    const int shared = static_cast<int>(
        std::mismatch(cached.begin(), cached.begin() + n, tokens + start).first - cached.begin());
    if (shared >= kMinPartialTokens && shared > m.partial_tokens) {
      m.partial_block = e->second.block;
      m.partial_tokens = shared;
    }
  }
  return m;
}

void PrefixCache::Match::fit_windows(const KvPool& pool) {
  if (partial_block >= 0) {
    std::vector<int> with_partial = blocks;
    with_partial.push_back(partial_block);
    if (!pool.has_window_for(with_partial, tokens())) drop_partial();
  }
  while (!blocks.empty() && !pool.has_window_for(blocks, full_tokens())) {
    blocks.pop_back();
    keys.pop_back();
    drop_partial();
  }
}

void PrefixCache::insert(uint64_t key, uint64_t parent, const int32_t* tokens, int block) {
  if (by_key_.count(key) || key_of_block_.count(block)) return;  // already cached elsewhere
  Entry e{parent, {}, block};
  std::copy(tokens, tokens + KvPool::kBlockTokens, e.tokens.begin());
  by_key_.emplace(key, e);
  key_of_block_[block] = key;
  children_.emplace(child_slot(parent, tokens), key);
  pool_.mark_cacheable(block);
}

void PrefixCache::insert_partial(uint64_t parent, const int32_t* tokens, int n_tokens, int block) {
  if (n_tokens < kMinPartialTokens || n_tokens >= KvPool::kBlockTokens || key_of_block_.count(block)) return;
  // A key of its own (salted, with the count), never one a full block's chain can produce.
  uint64_t key = mix(parent ^ 0x2545f4914f6cdd1dULL ^ static_cast<uint64_t>(n_tokens));
  for (int i = 0; i < n_tokens; ++i) key = mix(key ^ static_cast<uint32_t>(tokens[i]));
  if (by_key_.count(key)) return;  // the same head is cached already
  Entry e{parent, {}, block, n_tokens};
  std::copy(tokens, tokens + n_tokens, e.tokens.begin());
  by_key_.emplace(key, e);
  key_of_block_[block] = key;
  children_.emplace(child_slot(parent, tokens), key);
  pool_.mark_cacheable(block);
}

void PrefixCache::index_blocks(const SequenceKv& kv, const TokenAt& token_at, int limit, std::vector<uint64_t>& keys,
                               const BlockHook& on_indexed) {
  constexpr int BT = KvPool::kBlockTokens;
  limit = std::min(limit, kv.length());
  std::vector<int32_t> tokens(BT);
  while (static_cast<int>(keys.size() + 1) * BT <= limit) {
    const size_t index = keys.size();
    for (int i = 0; i < BT; ++i) tokens[i] = token_at(static_cast<int>(index) * BT + i);
    const uint64_t parent = index == 0 ? 0 : keys.back();
    const uint64_t key = chain(parent, tokens.data());
    insert(key, parent, tokens.data(), kv.blocks()[index]);
    if (on_indexed) on_indexed(key, parent, tokens.data(), kv.blocks()[index]);
    keys.push_back(key);
  }
}

void PrefixCache::index_tail(const SequenceKv& kv, const TokenAt& token_at, const std::vector<uint64_t>& keys) {
  constexpr int BT = KvPool::kBlockTokens;
  const int length = kv.length();
  const int full = length / BT;
  if (static_cast<int>(keys.size()) != full || static_cast<int>(kv.blocks().size()) <= full) return;
  std::vector<int32_t> tokens(length - full * BT);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = token_at(full * BT + static_cast<int>(i));
  insert_partial(full == 0 ? 0 : keys.back(), tokens.data(), static_cast<int>(tokens.size()), kv.blocks()[full]);
}

void PrefixCache::forget(int block) {
  auto it = key_of_block_.find(block);
  if (it == key_of_block_.end()) return;
  auto e = by_key_.find(it->second);
  if (e != by_key_.end()) {
    if (evict_hook_) evict_hook_(it->second, e->second.parent, e->second.tokens.data(), block);
    drop_state(e->second);
    auto [first, last] = children_.equal_range(child_slot(e->second.parent, e->second.tokens.data()));
    for (auto c = first; c != last; ++c) {
      if (c->second == it->second) {
        children_.erase(c);
        break;
      }
    }
  }
  by_key_.erase(it->second);
  key_of_block_.erase(it);
}

void PrefixCache::drop_state(Entry& e) {
  if (!e.state) return;
  state_bytes_ -= e.state->bytes();
  --states_;
  e.state.reset();
}

void PrefixCache::attach_state(uint64_t key, std::shared_ptr<const SequenceState> state) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || !state) return;
  drop_state(it->second);
  state_bytes_ += state->bytes();
  ++states_;
  it->second.state = std::move(state);
  it->second.state_used = ++state_clock_;
  enforce_state_budget();
}

void PrefixCache::detach_state(uint64_t key) {
  auto it = by_key_.find(key);
  if (it != by_key_.end()) drop_state(it->second);
}

std::shared_ptr<const SequenceState> PrefixCache::state_of(uint64_t key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || !it->second.state) return nullptr;
  it->second.state_used = ++state_clock_;
  return it->second.state;
}

void PrefixCache::enforce_state_budget() {
  while (state_bytes_ > state_budget_) {
    Entry* oldest = nullptr;
    for (auto& [_, e] : by_key_) {
      if (e.state && !pool_.referenced(e.block) && (!oldest || e.state_used < oldest->state_used)) oldest = &e;
    }
    if (!oldest) return;  // every snapshot belongs to a running sequence or a session
    drop_state(*oldest);
  }
}

}  // namespace llmd
