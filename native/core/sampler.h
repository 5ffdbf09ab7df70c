// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, with a
// per-request seeded generator so the same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace llmd {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;        // 1: off
  float min_p = 0.f;        // 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int sample(const float* logits, int vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> candidates_;
};

int argmax(const float* logits, int vocab);

}  // namespace llmd
