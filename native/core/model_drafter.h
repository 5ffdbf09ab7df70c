// Draft-model drafting for speculative decoding: a small model with the target's vocabulary,
// loaded beside it in the same worker (`llmd serve --draft-model NAME`), proposes the next
// tokens of every drafting sequence; the engine's batched verifier then checks them all in the
// target's one forward, as it does the n-gram drafter's.
//
// Why a model: prompt lookup only drafts text the sequence has already seen; a draft model of
// the same family guesses free text too. Each of its proposals costs one batched forward of
// the small model (all drafting sequences together), so it pays when the draft is much
// cheaper than the target and agrees with it often.
//
// Each sequence keeps its own KV in the drafter's own pool. The drafter feeds whatever of the
// sequence its KV lacks (the prompt on the first draft, then the tokens the target kept) and
// drafts from there; the draft KV of rejected drafts lies past the length the engine sets
// back after verification, like the target's.
//
// The draft KV has a prefix cache of its own (prefix_cache.h, over the drafter's pool), for
// the same reason the target has one: an agent's next turn repeats its whole conversation.
// Without it the draft model prefilled every request's prompt from scratch, one step's token
// budget at a time, and drafted nothing until it had caught up (a 20k-token agent prompt: 40
// steps of 512 before the first draft), while the target reused its cached prefix. Only
// positions holding the sequence's own tokens are indexed (prompt, then kept output), never
// drafted ones; a draft model with recurrent state keeps no cache (its KV alone is not enough
// to resume from).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kv_cache.h"
#include "model.h"
#include "prefix_cache.h"
#include "sampler.h"

namespace llmd {

// One sequence's drafting state: its draft-model (or MTP head) KV, the sampler its proposals
// are drawn with (the request's sampling settings, its own seeded generator) and the draft
// distributions q of the tokens proposed for the step being run (empty rows when greedy).
struct DraftSequence {
  DraftSequence(KvPool& pool, const SamplingParams& params);
  SequenceKv kv;
  Sampler sampler;
  std::vector<std::vector<float>> q;
  // MTP head only (mtp_drafter.h): the model's final hidden states at the positions from
  // start + kv.length() on that the head has not read yet, hidden_size floats each.
  std::vector<float> hidden;
  // MTP head only: the sequence's position of the head's entry 0. A sequence that reuses KV it
  // did not compute (a cached prefix, a session's history, a sibling's prompt) has no hidden
  // states there, so its head starts where the model starts computing them (mtp_drafter.h).
  int start = 0;
  // Draft model only: whether the draft prefix cache was asked for this sequence's prompt yet,
  // and the chain keys of its full blocks that the cache holds, in order.
  bool admitted = false;
  std::vector<uint64_t> block_keys;
};

class ModelDrafter {
 public:
  // kv_budget_bytes bounds the draft KV of all sequences together; kv_type as the target's.
  ModelDrafter(std::unique_ptr<Model> model, size_t kv_budget_bytes, KvType kv_type);
  const ModelInfo& info() const { return model_->info(); }

  std::unique_ptr<DraftSequence> open(const SamplingParams& params) {
    return std::make_unique<DraftSequence>(pool_, params);
  }

  struct Job {
    DraftSequence* state = nullptr;
    std::function<int32_t(int)> token_at;  // the sequence's tokens, prompt then output
    int length = 0;                        // how many; the last is not in the target's KV yet
    int want = 0;                          // tokens to propose
    std::vector<int32_t> tokens;           // out: the proposal (may be shorter, even empty)
  };
  // Proposes for every job: one batched forward per drafted position. A sequence whose draft
  // KV lags by more than `catch_up_budget` positions (a long prompt) feeds that many this step
  // and proposes nothing yet, so a prompt never stalls the other streams for more than a chunk.
  void propose(std::vector<Job>& jobs, int catch_up_budget);
  // After verification the sequence has `kept` positions its draft KV may keep: positions past
  // them held rejected drafts and are dropped.
  static void keep(DraftSequence& state, int kept) {
    if (state.kv.length() > kept) state.kv.set_length(kept);
  }
  // The sequence ends with `length` positions of its own tokens in the target's KV: the draft
  // cache indexes the draft KV's full blocks among them and the head of its last, partly
  // filled block (a chat preamble shorter than a block is then reused too), then the KV goes.
  void finish(DraftSequence& state, const std::function<int32_t(int)>& token_at, int length);

  // Prompt positions sequences took from the draft cache instead of running the draft model.
  uint64_t cached_tokens() const { return cached_tokens_.load(std::memory_order_relaxed); }

 private:
  // Starts a fresh sequence on the cached draft KV of its prompt's longest cached prefix
  // (always leaving its last token to run, for the first draft's logits).
  void admit(Job& job);
  // Indexes the full blocks of the draft KV below `limit` (positions of the sequence's own
  // tokens) that the cache does not hold for this sequence yet.
  void index_full_blocks(DraftSequence& state, const std::function<int32_t(int)>& token_at, int limit);

  std::unique_ptr<Model> model_;
  KvPool pool_;
  PrefixCache cache_{pool_};
  const bool cacheable_;  // false for a model with recurrent state
  std::atomic<uint64_t> cached_tokens_{0};
};

}  // namespace llmd
