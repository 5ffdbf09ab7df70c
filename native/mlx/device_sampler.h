// Sampling on the device: the token of each decode row picked where its logits are, so only
// the token ids come back to the host instead of a [rows, vocab] float32 block.
//
// Why: on a GPU the logits rows are the largest transfer of a decode step (49,152 floats a row
// on SmolLM2, 151,936 on Qwen) and the host sampler then sorts them on one core. The engine
// asks for it (StepSegment::device_sample) only for rows whose request needs nothing else of
// the logits on the host: no logprobs, penalties, logit bias or grammar, not a draft's
// verification and not a prompt's first token (its logits seed forked siblings).
//
// It draws from the host sampler's distribution (sampler.cpp, Sampler::distribution): logits /
// temperature, the top_k largest, softmax over them, min_p then top_p cut the sorted list, and
// the token is where the running sum of the kept probabilities first reaches u * their mass,
// with u drawn on the host from the request's own generator, the draw the host sampler makes.
// A seed therefore gives the same tokens on either sampler, up to float32 (device) against
// float64 (host) sums at a boundary. Greedy rows take the argmax of the same float32 logits
// (the first largest, as the host's argmax).
#pragma once

#include <cstdint>
#include <vector>

#include "../core/step.h"

// Declared, not included: this header is also the pybind module's, where MLX's names would
// clash with llmd's (ThreadPool).
namespace mlx::core {
class array;
}

namespace llmd {

// logits [rows, vocab] float32, one parameter set per row: the tokens, [rows] int32 (lazy).
mlx::core::array sample_on_device(const mlx::core::array& logits, const std::vector<StepSegment::DeviceSample>& params);
// The same on one row of logits repeated once per parameter set, evaluated: for tests.
std::vector<int32_t> sample_row_on_device(const std::vector<float>& logits,
                                          const std::vector<StepSegment::DeviceSample>& params);

}  // namespace llmd
