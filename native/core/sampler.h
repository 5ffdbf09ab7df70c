// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, with a
// per-request seeded generator so the same seed gives the same tokens; the logit processors
// that run before it (repetition / frequency / presence penalties, logit bias); and log
// probabilities of the model's own distribution for `logprobs`.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace llmd {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;        // 1: off
  float min_p = 0.f;        // 0: off
  uint64_t seed = 0;
  // OpenAI's penalties count generated tokens only; the repetition penalty (HF / vLLM
  // semantics: logit / p when positive, * p when negative) covers prompt and output.
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  float repetition_penalty = 1.f;  // 1: off
  // How many of the latest tokens (prompt and output) the repetition penalty looks at
  // (llama.cpp's and Ollama's repeat_last_n); 0: the whole context.
  int repetition_window = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int top_logprobs = -1;  // -1: no logprobs; 0: the sampled token's; n: also the n likeliest
};

// The sampled token's log probability under the model (log-softmax of the raw logits, before
// penalties, bias, constraints and temperature), and the likeliest alternatives.
struct TokenLogprob {
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;
};

// Token occurrence counts of one sequence, kept only when a penalty needs them.
struct TokenCounts {
  explicit TokenCounts(int window = 0) : window(window) {}
  std::unordered_map<int32_t, int> generated;
  std::unordered_map<int32_t, int> seen;  // prompt + generated (the latest `window` when > 0)
  void add_prompt(const std::vector<int32_t>& prompt);
  void add_generated(int32_t token);

 private:
  void see(int32_t token);
  int window = 0;
  std::deque<int32_t> recent;  // the tokens `seen` counts, when windowed
};

bool needs_counts(const SamplingParams& p);
// Penalties and bias, in place, on one row of logits.
void apply_logit_processors(const SamplingParams& p, const TokenCounts& counts, float* logits, int vocab);
// Log-softmax facts of a raw row: the normaliser and the top-n tokens with their logprobs.
float log_normaliser(const float* logits, int vocab);
std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int vocab, float log_z, int n);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int sample(const float* logits, int vocab);
  // Speculative sampling of a position whose drafted token is `draft` (a deterministic
  // draft, e.g. prompt lookup): keeps the draft with probability p(draft) under the same
  // distribution sample() draws from (temperature, top-k, min-p, top-p applied), otherwise
  // draws from p with the draft removed and renormalised. The token returned is distributed
  // exactly as sample()'s: P(draft) = p(draft), P(x) = (1 - p(draft)) p(x) / (1 - p(draft)).
  // Greedy: the argmax, as sample(). The caller compares the result with `draft`.
  int sample_draft(const float* logits, int vocab, int draft);
  // Speculative sampling of a position whose drafted token `draft` was drawn from a draft
  // model's distribution q (one probability per vocabulary entry, propose() below): keeps the
  // draft with probability min(1, p(draft) / q(draft)), otherwise draws from the residual
  // max(0, p - q) renormalised (Leviathan et al. 2023; Chen et al. 2023). The token returned
  // is distributed exactly as sample()'s, whatever q is. Greedy: the argmax, as sample().
  int sample_draft(const float* logits, int vocab, int draft, const std::vector<float>& q);
  // The draft side of that rule: draws a token from the distribution sample() would draw
  // from on these (draft-model) logits and writes that distribution into q (vocab entries,
  // zero outside the kept set). Greedy: the argmax, and q is left empty (the verifier keeps a
  // greedy draft exactly when it is the target's argmax, with no probabilities needed).
  int propose(const float* logits, int vocab, std::vector<float>& q);
  // The uniform number in [0, 1) sample() would draw next (it draws mass * this), for a
  // token sampled elsewhere from the same distribution (native/mlx/device_sampler.h).
  double draw_unit() { return std::generate_canonical<double, 53>(rng_); }

 private:
  // The candidates sample() draws from: candidates_[0, n) with probabilities probs_[0, n)
  // (unnormalised; they sum to the returned mass).
  double distribution(const float* logits, int vocab, size_t& n);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> candidates_;
  std::vector<double> probs_;
};

int argmax(const float* logits, int vocab);

}  // namespace llmd
