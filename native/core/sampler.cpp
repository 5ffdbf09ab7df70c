#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace llmd {

namespace {

using Floats4 = float __attribute__((vector_size(16)));
using Ints4 = int32_t __attribute__((vector_size(16)));

Floats4 load4(const float* at) {
  Floats4 x;
  std::memcpy(&x, at, sizeof(x));
  return x;
}

}  // namespace

// The index the plain loop `if (logits[i] > logits[best]) best = i` returns (the first largest;
// a NaN is never taken, one at index 0 is kept), in two streaming passes: the largest value
// lane-wise, then the first index holding it. Why: the plain loop's compare-and-branch costs ~1
// ns a logit, and every greedy row of a step pays it on the engine's thread while the kernels'
// threads wait (49,152 logits a row: 0.4 ms of an 8-row step of the test model, 2-3% of it;
// these passes take a fifth of that). Vector extensions, not intrinsics: the engine's core is
// built for the baseline ISA (16-byte vectors on x86-64 and arm64 alike).
int argmax(const float* logits, int vocab) {
  if (vocab <= 0 || std::isnan(logits[0])) return 0;
  constexpr int kWidth = 4, kVecs = 4, kStride = kWidth * kVecs;
  Floats4 lanes[kVecs];
  for (Floats4& v : lanes) v = Floats4{} + logits[0];
  int i = 0;
  for (; i + kStride <= vocab; i += kStride) {
    for (int j = 0; j < kVecs; ++j) {
      const Floats4 x = load4(logits + i + kWidth * j);
      const Ints4 more = x > lanes[j];
      lanes[j] = reinterpret_cast<Floats4>((reinterpret_cast<Ints4>(x) & more) |
                                           (reinterpret_cast<Ints4>(lanes[j]) & ~more));
    }
  }
  float best = logits[0];
  for (const Floats4& v : lanes) {
    for (int j = 0; j < kWidth; ++j) best = v[j] > best ? v[j] : best;
  }
  for (; i < vocab; ++i) best = logits[i] > best ? logits[i] : best;
  int at = 0;
  for (; at + kStride <= vocab; at += kStride) {
    Ints4 hit{};
    for (int j = 0; j < kVecs; ++j) hit |= load4(logits + at + kWidth * j) == best;
    if (hit[0] | hit[1] | hit[2] | hit[3]) break;
  }
  for (; at < vocab; ++at) {
    if (logits[at] == best) return at;
  }
  return 0;  // not reached: best is one of the logits
}

void TokenCounts::see(int32_t token) {
  ++seen[token];
  if (window <= 0) return;
  recent.push_back(token);
  if (static_cast<int>(recent.size()) > window) {
    const int32_t old = recent.front();
    recent.pop_front();
    if (--seen[old] == 0) seen.erase(old);
  }
}

void TokenCounts::add_prompt(const std::vector<int32_t>& prompt) {
  for (int32_t t : prompt) see(t);
}

void TokenCounts::add_generated(int32_t token) {
  ++generated[token];
  see(token);
}

bool needs_counts(const SamplingParams& p) {
  return p.frequency_penalty != 0.f || p.presence_penalty != 0.f || p.repetition_penalty != 1.f;
}

void apply_logit_processors(const SamplingParams& p, const TokenCounts& counts, float* logits, int vocab) {
  if (p.repetition_penalty != 1.f) {
    for (const auto& [t, n] : counts.seen) {
      if (t < 0 || t >= vocab) continue;
      float& l = logits[t];
      l = l > 0.f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.f || p.presence_penalty != 0.f) {
    for (const auto& [t, n] : counts.generated) {
      if (t < 0 || t >= vocab) continue;
      logits[t] -= static_cast<float>(n) * p.frequency_penalty + p.presence_penalty;
    }
  }
  for (const auto& [t, bias] : p.logit_bias) {
    if (t >= 0 && t < vocab) logits[t] += bias;
  }
}

float log_normaliser(const float* logits, int vocab) {
  float max_logit = logits[0];
  for (int i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logits[i] - max_logit));
  return max_logit + static_cast<float>(std::log(total));
}

std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int vocab, float log_z, int n) {
  n = std::clamp(n, 0, vocab);
  std::vector<int32_t> ids(vocab);
  for (int i = 0; i < vocab; ++i) ids[i] = i;
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
  std::vector<std::pair<int32_t, float>> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) out.emplace_back(ids[i], logits[ids[i]] - log_z);
  return out;
}

double Sampler::distribution(const float* logits, int vocab, size_t& n) {
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
  probs_.resize(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) {
    probs_[i] = std::exp(static_cast<double>(candidates_[i].first - max_logit));
    total += probs_[i];
  }
  for (double& p : probs_) p /= total;
  n = probs_.size();
  if (params_.min_p > 0.f) {
    const double floor = params_.min_p * probs_[0];
    size_t m = 1;
    while (m < n && probs_[m] >= floor) ++m;
    n = m;
  }
  if (params_.top_p < 1.f) {
    double cum = 0.0;
    size_t m = 0;
    while (m < n) {
      cum += probs_[m++];
      if (cum >= params_.top_p) break;
    }
    n = std::max<size_t>(1, m);
  }
  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) mass += probs_[i];
  return mass;
}

int Sampler::sample(const float* logits, int vocab) {
  if (params_.temperature <= 0.f || params_.top_k == 1) return argmax(logits, vocab);
  size_t n = 0;
  const double mass = distribution(logits, vocab, n);
  std::uniform_real_distribution<double> uniform(0.0, mass);
  double r = uniform(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= probs_[i];
    if (r <= 0.0) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

int Sampler::sample_draft(const float* logits, int vocab, int draft) {
  if (params_.temperature <= 0.f || params_.top_k == 1) return argmax(logits, vocab);
  size_t n = 0;
  const double mass = distribution(logits, vocab, n);
  size_t d = n;
  for (size_t i = 0; i < n; ++i) {
    if (candidates_[i].second == draft) d = i;
  }
  const double p_draft = d < n ? probs_[d] : 0.0;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  if (p_draft > 0.0 && unit(rng_) * mass < p_draft) return draft;
  // Rejected: sample from the rest, renormalised.
  const double rest = mass - p_draft;
  if (rest <= 0.0) return draft;  // the draft held all the mass (rounding)
  std::uniform_real_distribution<double> uniform(0.0, rest);
  double r = uniform(rng_);
  size_t last = n;
  for (size_t i = 0; i < n; ++i) {
    if (i == d) continue;
    last = i;
    r -= probs_[i];
    if (r <= 0.0) return candidates_[i].second;
  }
  return candidates_[last].second;
}

int Sampler::propose(const float* logits, int vocab, std::vector<float>& q) {
  q.clear();
  if (params_.temperature <= 0.f || params_.top_k == 1) return argmax(logits, vocab);
  size_t n = 0;
  const double mass = distribution(logits, vocab, n);
  q.assign(vocab, 0.f);
  for (size_t i = 0; i < n; ++i) q[candidates_[i].second] = static_cast<float>(probs_[i] / mass);
  std::uniform_real_distribution<double> uniform(0.0, mass);
  double r = uniform(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= probs_[i];
    if (r <= 0.0) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

int Sampler::sample_draft(const float* logits, int vocab, int draft, const std::vector<float>& q) {
  if (params_.temperature <= 0.f || params_.top_k == 1 || q.empty()) return sample_draft(logits, vocab, draft);
  size_t n = 0;
  const double mass = distribution(logits, vocab, n);
  double p_draft = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (candidates_[i].second == draft) p_draft = probs_[i] / mass;
  }
  const double q_draft = draft >= 0 && draft < vocab ? q[draft] : 0.0;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  // Accept with probability min(1, p / q); a draft q gave no mass to cannot have been drawn.
  if (q_draft > 0.0 && unit(rng_) * q_draft < p_draft) return draft;
  // Rejected: draw from max(0, p - q), which only tokens of the target's kept set can have.
  double rest = 0.0;
  for (size_t i = 0; i < n; ++i) rest += std::max(0.0, probs_[i] / mass - q[candidates_[i].second]);
  if (rest <= 0.0) {
    // p <= q everywhere only when p == q up to rounding, where the draft is always accepted:
    // fall back to p itself.
    return sample(logits, vocab);
  }
  std::uniform_real_distribution<double> uniform(0.0, rest);
  double r = uniform(rng_);
  size_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = std::max(0.0, probs_[i] / mass - q[candidates_[i].second]);
    if (w <= 0.0) continue;
    last = i;
    r -= w;
    if (r <= 0.0) return candidates_[i].second;
  }
  return candidates_[last].second;
}

}  // namespace llmd
