// Prefix cache: full KV blocks indexed by the hash chain of the tokens that produced them,
// so any later sequence whose prompt starts with the same tokens reuses them instead of
// prefilling again (multi-turn chat, shared system prompts). Blocks stay in the pool after
// their sequences end, idle and evictable in LRU order under the KV budget (KvPool).
//
// A block's key is hash(parent key, its 64 tokens); entries also keep the tokens and parent
// key and are verified on lookup, so a hash collision can never serve the wrong KV.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kv_cache.h"

namespace llmd {

class PrefixCache {
 public:
  explicit PrefixCache(KvPool& pool);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  static uint64_t chain(uint64_t parent, const int32_t* tokens);

  struct Match {
    std::vector<int> blocks;
    std::vector<uint64_t> keys;
    int tokens() const { return static_cast<int>(blocks.size()) * KvPool::kBlockTokens; }
  };
  // The longest run of cached blocks covering a prefix of tokens[0, max_tokens).
  Match match(const int32_t* tokens, int max_tokens) const;
  // Records that `block` holds the tokens of one full block whose chain key is `key`.
  void insert(uint64_t key, uint64_t parent, const int32_t* tokens, int block);

  size_t entries() const { return by_key_.size(); }

 private:
  struct Entry {
    uint64_t parent;
    std::array<int32_t, KvPool::kBlockTokens> tokens;
    int block;
  };
  void forget(int block);

  KvPool& pool_;
  std::unordered_map<uint64_t, Entry> by_key_;
  std::unordered_map<int, uint64_t> key_of_block_;
};

}  // namespace llmd
