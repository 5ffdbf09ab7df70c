#include "sampler.h"

#include <algorithm>
#include <cmath>

namespace llmd {

int argmax(const float* logits, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int Sampler::sample(const float* logits, int vocab) {
  if (params_.temperature <= 0.f || params_.top_k == 1) return argmax(logits, vocab);
  candidates_.clear();
  candidates_.reserve(vocab);
  for (int i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i] / params_.temperature, i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the survivors (sorted, largest first).
  const float max_logit = candidates_.front().first;
  double total = 0.0;
  std::vector<double> probs(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) {
    probs[i] = std::exp(static_cast<double>(candidates_[i].first - max_logit));
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  size_t n = probs.size();
  if (params_.min_p > 0.f) {
    const double floor = params_.min_p * probs[0];
    size_t m = 1;
    while (m < n && probs[m] >= floor) ++m;
    n = m;
  }
  if (params_.top_p < 1.f) {
    double cum = 0.0;
    size_t m = 0;
    while (m < n) {
      cum += probs[m++];
      if (cum >= params_.top_p) break;
    }
    n = std::max<size_t>(1, m);
  }
  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) mass += probs[i];
  std::uniform_real_distribution<double> uniform(0.0, mass);
  double r = uniform(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= probs[i];
    if (r <= 0.0) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

}  // namespace llmd
