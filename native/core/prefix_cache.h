// Prefix cache: full KV blocks indexed by the hash chain of the tokens that produced them,
// so any later sequence whose prompt starts with the same tokens reuses them instead of
// prefilling again (multi-turn chat, shared system prompts). Blocks stay in the pool after
// their sequences end, idle and evictable in LRU order under the KV budget (KvPool).
//
// A block's key is hash(parent key, its 64 tokens); entries also keep the tokens and parent
// key and are verified on lookup, so a hash collision can never serve the wrong KV.
//
// Partial blocks: after the whole blocks, a prompt usually shares only the head of a cached
// block (requests that differ after a common system prompt or chat-template preamble, shorter
// than a block; a repeated prompt whose last block is cached but longer than what may be
// reused). match() also finds the cached child of the last matched block whose tokens share
// the longest head with the prompt; the engine copies that block into the new sequence's own
// block and prefills from the end of the shared head (llama-server's slots reuse any common
// prefix token by token; this gives the same reuse with block sharing intact).
//
// Models with recurrent state (Model::has_recurrent_state) need, besides the KV, the state at
// exactly the position where reuse stops. An entry may hold such a snapshot (the state after
// its block's last token: a function of the token chain, so valid whichever sequence computed
// it); it goes with the entry when the block is evicted. Snapshots are large (a whole
// recurrent state), so their bytes have a budget: past it, the least recently used snapshot
// whose block no sequence or session references is dropped (its KV stays, reusable only up to
// an earlier snapshot).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
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

  // Shorter shared heads are not worth a block copy (and would make every request reuse its
  // BOS or first template token).
  static constexpr int kMinPartialTokens = 8;

  struct Match {
    std::vector<int> blocks;
    std::vector<uint64_t> keys;
    // A cached block after `blocks` whose first partial_tokens tokens continue the match
    // (-1: none). Only meaningful right after `blocks`: drop it when shortening the match.
    int partial_block = -1;
    int partial_tokens = 0;
    int full_tokens() const { return static_cast<int>(blocks.size()) * KvPool::kBlockTokens; }
    int tokens() const { return full_tokens() + (partial_block >= 0 ? partial_tokens : 0); }
    void drop_partial() {
      partial_block = -1;
      partial_tokens = 0;
    }
    // Sliding-window layers need the window before the reuse point: shortens the match to a
    // prefix whose window parts still exist in `pool` (kv_cache.h, "Window parts"), possibly
    // to nothing.
    void fit_windows(const KvPool& pool);
  };
  // The longest run of cached blocks covering a prefix of tokens[0, max_tokens), then the
  // cached block sharing the longest head (>= kMinPartialTokens) with what follows.
  Match match(const int32_t* tokens, int max_tokens) const;
  // Records that `block` holds the tokens of one full block whose chain key is `key`.
  void insert(uint64_t key, uint64_t parent, const int32_t* tokens, int block);
  // Records the head of a block that a finished sequence left partly filled: its first
  // n_tokens tokens (kMinPartialTokens or more, fewer than a block) after the block of key
  // `parent` (0: none). Such a block is only ever a partial match (copied, never shared), and
  // its owner is gone, so those positions never change. Why: a chat template's preamble and
  // system prompt are often shorter than a block; without this, requests that share only that
  // much prefill it every time (mlx-lm's and llama-server's caches reuse any common prefix).
  void insert_partial(uint64_t parent, const int32_t* tokens, int n_tokens, int block);

  // A sequence's tokens by position (prompt, then kept output), for the two calls below.
  using TokenAt = std::function<int32_t(int)>;
  // Told about each block index_blocks indexes (the engine's disk tier writes it through).
  using BlockHook = std::function<void(uint64_t key, uint64_t parent, const int32_t* tokens, int block)>;
  // Indexes the full blocks of `kv` below position `limit` that `keys` (the chain keys of the
  // sequence's blocks indexed so far, in order) does not cover yet, appending their keys. The
  // engine and the draft model (model_drafter.h) index their sequences through this one walk.
  void index_blocks(const SequenceKv& kv, const TokenAt& token_at, int limit, std::vector<uint64_t>& keys,
                    const BlockHook& on_indexed = {});
  // A finished sequence's partly filled last block as a reusable head (insert_partial), when
  // `keys` covers every full block before it (a sequence that never ran has nothing indexed).
  void index_tail(const SequenceKv& kv, const TokenAt& token_at, const std::vector<uint64_t>& keys);

  // Recurrent-state snapshots of cached blocks (ignored for a key not cached).
  void attach_state(uint64_t key, std::shared_ptr<const SequenceState> state);
  void detach_state(uint64_t key);
  // The snapshot after the block of `key`, or null; marks it recently used.
  std::shared_ptr<const SequenceState> state_of(uint64_t key);
  void set_state_budget(size_t bytes) { state_budget_ = bytes; }
  size_t state_bytes() const { return state_bytes_; }
  size_t states() const { return states_; }

  size_t entries() const { return by_key_.size(); }
  // Told about each entry just before its block is evicted (its KV still intact): the disk
  // tier writes what it does not hold yet.
  using EvictHook = std::function<void(uint64_t key, uint64_t parent, const int32_t* tokens, int block)>;
  void set_evict_hook(EvictHook hook) { evict_hook_ = std::move(hook); }

 private:
  struct Entry {
    uint64_t parent;
    std::array<int32_t, KvPool::kBlockTokens> tokens;
    int block;
    int n_tokens = KvPool::kBlockTokens;  // fewer: a partly filled block (insert_partial)
    std::shared_ptr<const SequenceState> state;
    uint64_t state_used = 0;  // recency stamp of the snapshot
  };
  void drop_state(Entry& e);
  void enforce_state_budget();
  void forget(int block);
  // Key of the children index: a block's parent key and its first kMinPartialTokens tokens
  // (a partial match needs at least those, so only real candidates share a slot).
  static uint64_t child_slot(uint64_t parent, const int32_t* tokens);

  KvPool& pool_;
  std::unordered_map<uint64_t, Entry> by_key_;
  std::unordered_map<int, uint64_t> key_of_block_;
  std::unordered_multimap<uint64_t, uint64_t> children_;  // child_slot -> key
  size_t state_budget_ = SIZE_MAX;
  size_t state_bytes_ = 0;
  size_t states_ = 0;
  uint64_t state_clock_ = 0;
  EvictHook evict_hook_;
};

}  // namespace llmd
