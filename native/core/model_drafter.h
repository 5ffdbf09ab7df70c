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
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kv_cache.h"
#include "model.h"
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

 private:
  std::unique_ptr<Model> model_;
  KvPool pool_;
};

}  // namespace llmd
