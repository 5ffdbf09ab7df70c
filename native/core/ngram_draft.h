// Prompt-lookup (n-gram) drafting for speculative decoding, and the per-sequence control of
// how many tokens to draft.
//
// Why: decode reads every weight once per step whatever the number of rows, so verifying k
// guessed tokens in one forward costs about one step. Text that repeats what the sequence has
// already seen (an edited file, a diff, tool arguments quoting their input) is guessed well
// by looking up where the last few tokens occurred before and copying what followed. No
// second model is needed; a wrong guess costs only the rows it added to one step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace llmd {

// Up to `max_tokens` tokens proposed to follow the sequence whose token i is token_at(i),
// 0 <= i < length: the continuation of the earlier occurrence of its tail that matches the
// most tokens (at least kMinNgram, counted up to kMaxNgram; the latest among equals). The
// continuation may run into the sequence's own end. Empty when nothing matches.
std::vector<int32_t> ngram_draft(const std::function<int32_t(int)>& token_at, int length, int max_tokens);

// The most tokens a sequence with `generated` of its `max_tokens` may draft: the row after the
// last draft yields one more token, so a draft never runs past max_tokens.
inline int draft_room_left(int max_tokens, int generated) { return max_tokens - generated - 1; }

inline constexpr int kMaxNgram = 32;
inline constexpr int kMinNgram = 1;
// How far back the lookup searches (positions): bounds a step's drafting cost on long contexts.
inline constexpr int kNgramSearchWindow = 1 << 15;

// How many tokens a sequence drafts next, from how its recent drafts fared: grow while whole
// drafts are accepted, shrink to what was accepted when one is rejected part way, and after
// repeated drafts of which nothing was accepted, draft nothing for a while (doubling the wait
// each time) so text that drafts badly runs as plain decode. This is the most a sequence
// drafts; the cost model (draft_cost.h) then verifies only the drafts expected to pay for
// their rows in the step.
class DraftLength {
 public:
  explicit DraftLength(int max_draft = 0) : max_(max_draft), next_(max_draft > 0 ? std::min(max_draft, 4) : 0) {}
  int max() const { return max_; }
  // Tokens to draft this step (0: skip drafting this step).
  int next();
  void record(int drafted, int accepted);

 private:
  int max_ = 0;
  int next_ = 0;
  int misses_ = 0;     // drafts in a row of which nothing was accepted
  int cooldown_ = 0;   // steps left without drafting
  int backoff_ = 1;    // the next cooldown's length
};

}  // namespace llmd
