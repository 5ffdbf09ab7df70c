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
  for (int n = std::min(kMaxNgram, n_tokens - 1); n >= kMinNgram; --n) {
    const int32_t* tail = t.data() + n_tokens - n;
    // The latest start s < n_tokens - n whose n tokens equal the tail: its continuation begins
    // at s + n, which is then < n_tokens.
    for (int s = n_tokens - n - 1; s >= 0; --s) {
      if (!std::equal(tail, tail + n, t.data() + s)) continue;
      const int first = s + n;
      const int take = std::min(max_tokens, n_tokens - first);
      out.assign(t.begin() + first, t.begin() + first + take);
      return out;
    }
  }
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
