// SwiGLU over interleaved (gate, up) pairs, the epilogue of the fused gate/up projection.
#pragma once

namespace llmd {

// out[i] = silu(pairs[2i]) * pairs[2i + 1] for i in [0, n). Vectorized (cloned per ISA);
// every element goes through the same vector arithmetic whatever n, so an output depends
// only on its own pair.
void swiglu_pairs(const float* pairs, float* out, int n);

}  // namespace llmd
