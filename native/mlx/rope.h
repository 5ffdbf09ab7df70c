// Rotary position embedding tables. GGUF llama weights have Q/K permuted by the converter, so
// GGUF models rotate interleaved pairs (x[2i], x[2i+1]); Hugging Face checkpoints rotate
// halves (x[i], x[i + d/2]).
#pragma once

#include <vector>

namespace llmd {

struct Rope {
  int dims = 0;                  // rotated dimensions (== head_dim for llama)
  bool interleaved = true;
  std::vector<float> inv_freq;   // dims / 2 frequencies, scaling already applied

  // cos/sin of every frequency at position `pos` (dims / 2 each): computed once per row per
  // step and shared by all layers and heads.
  void tables(int pos, float* cos_out, float* sin_out) const;
  // Rotates one head vector in place with a row's tables.
  void rotate(float* x, const float* cos_t, const float* sin_t) const;
};

// Frequencies theta^(-2i/dims), divided by per-frequency `factors` when given (llama 3
// rope scaling as GGUF stores it in rope_freqs.weight).
std::vector<float> rope_inv_freq(int dims, double theta, const std::vector<float>& factors = {});

// Llama 3.x "llama3" rope scaling from a Hugging Face config (computes the factors GGUF stores).
std::vector<float> llama3_rope_factors(int dims, double theta, double factor, double low_freq_factor,
                                       double high_freq_factor, int original_context);

}  // namespace llmd
