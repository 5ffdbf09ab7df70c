#include "ngram_draft.h"

#include <algorithm>

namespace llmd {

std::vector<int32_t> ngram_draft(const std::function<int32_t(int)>& token_at, int length, int max_tokens) {
  std::vector<int32_t> out;
  if (max_tokens <= 0 || length < 2) return out;
  // The sequence's tail is read many times: copy the searched window once.
  const int from = std::max(0, length - kNgramSearchWindow);
  std::vector<int32_t> t(length - from);
  for (int i = from; i < length; ++i) t[i - from] = token_at(i);
  const int n_tokens = static_cast<int>(t.size());
  const int32_t last = t.back();
  // Every earlier position e whose token equals the last one is a candidate: the match is how
  // many tokens up to e agree with the tokens up to the end. The longest match wins (a common
  // short n-gram such as "self." recurs everywhere; a long one pins down where the text being
  // repeated is), the latest among equals.
  int best_end = -1, best_len = 0;
  for (int e = n_tokens - 2; e >= 0; --e) {
    if (t[e] != last) continue;
    int len = 1;
    while (len < kMaxNgram && e - len >= 0 && t[e - len] == t[n_tokens - 1 - len]) ++len;
    if (len > best_len) {
      best_len = len;
      best_end = e;
      if (len == kMaxNgram) break;
    }
  }
  if (best_len < kMinNgram || best_end < 0) return out;
  const int first = best_end + 1;
  const int take = std::min(max_tokens, n_tokens - first);
  out.assign(t.begin() + first, t.begin() + first + take);
  return out;
}

int DraftLength::next() {
  if (max_ <= 0) return 0;
  if (cooldown_ > 0) {
    --cooldown_;
    return 0;
  }
  return next_;
}

void DraftLength::record(int drafted, int accepted) {
  if (drafted <= 0) return;
  if (accepted == drafted) {
    next_ = std::min(max_, std::max(next_, drafted) * 2);
  } else {
    next_ = std::max(1, accepted + 1);
  }
  if (accepted > 0) {
    misses_ = 0;
    backoff_ = 1;
    return;
  }
  if (++misses_ >= 2) {
    cooldown_ = backoff_;
    backoff_ = std::min(backoff_ * 2, 64);
    misses_ = 0;
  }
}

}  // namespace llmd
