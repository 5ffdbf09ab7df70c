// MTP drafting for speculative decoding: the multi-token-prediction head a checkpoint ships
// beside its model (Qwen3.5's `mtp.*`, model.h MtpHead) proposes the next tokens of every
// drafting sequence; the engine's batched verifier checks them in the model's one forward, as
// it does the other drafters' tokens.
//
// Why: the head is one decoder layer that reads the model's own final hidden state, so it
// drafts free text far better than prompt lookup at a fraction of a draft model's cost, and
// it needs no second checkpoint.
//
// The head's entry at position i reads the model's hidden state h_i and token i + 1, and
// guesses token i + 2. The engine hands each drafting sequence's hidden states to its
// DraftSequence::hidden as the model computes them (every position the sequence keeps: prompt
// chunks, the last token and the accepted drafts). Before a step, propose() feeds the head the
// positions it has not read yet (its KV catches up, the last of them giving the first guess:
// the token after the one just sampled), then chains: each further guess reads the previous
// guess and the head's own output as its hidden state (as vLLM's proposer does). The chained
// entries' KV is dropped at once (the head's KV keeps only entries made from the model's hidden
// states; they are made again from the model's, one step later, for the drafts it accepts), so
// nothing of a rejected draft survives in the head.
//
// A sequence that starts past position 0 (its prompt's head reused from the prefix cache or a
// session, or a sibling of n > 1 that starts from its first choice's KV) has no hidden states
// for the reused positions: the model never ran them in this sequence, and keeping every
// position's hidden state in the cache would cost as much as its KV again. Its head starts at
// the first position the model computes (DraftSequence::start): entry 0 of its KV is that
// position, the entries are fed at positions shifted down by `start` (rotary attention depends
// only on the distance between positions, so the shift changes nothing), and the head attends
// to the positions from there on only. Its guesses can be worse than with the whole history,
// never wrong: the verifier keeps only what the model itself would take.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kv_cache.h"
#include "model.h"
#include "model_drafter.h"
#include "sampler.h"

namespace llmd {

class MtpDrafter {
 public:
  // `head` belongs to the model (it shares the model's embedding and lm_head); kv_budget_bytes
  // bounds the head's KV of all sequences together.
  MtpDrafter(MtpHead& head, int hidden_size, int vocab_size, size_t kv_budget_bytes, KvType kv_type);

  std::unique_ptr<DraftSequence> open(const SamplingParams& params) {
    return std::make_unique<DraftSequence>(pool_, params);
  }
  int hidden_size() const { return hidden_size_; }

  struct Job {
    DraftSequence* state = nullptr;
    std::function<int32_t(int)> token_at;  // the sequence's tokens, prompt then output
    int want = 0;                          // tokens to propose
    std::vector<int32_t> tokens;           // out: the proposal (may be shorter, even empty)
  };
  // Proposes for every job: the catch-up and first guess in one batched forward of the head,
  // then one batched forward per further guess. A sequence with more than `catch_up_budget`
  // unread positions (a long prompt) reads that many this step and proposes nothing yet.
  void propose(std::vector<Job>& jobs, int catch_up_budget);

  // Reference runs (tests, tools): the head's logits for `hidden` [n, hidden_size] (the model's
  // hidden states at positions 0..n-1) and `tokens` (positions 1..n), one row per position,
  // then `chain` greedy chained guesses after the last; returns (n + chain) rows of logits and
  // the chained tokens.
  std::vector<float> probe(const std::vector<float>& hidden, const std::vector<int32_t>& tokens, int chain,
                           std::vector<int32_t>& chained);

 private:
  MtpHead& head_;
  int hidden_size_;
  int vocab_;
  KvPool pool_;
};

}  // namespace llmd
