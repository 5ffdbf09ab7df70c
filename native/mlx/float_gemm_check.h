// float_gemm.h's product on plain buffers, for the bindings' test hook (no MLX headers: they
// bring a global ThreadPool that clashes with llmd's in bindings.cpp).
#pragma once

#include <vector>

namespace llmd {

// out [rows, n] = x [rows, k] @ w [n, k]^T (+ bias [n]) (GELU-tanh) (+ residual [rows, n]), w
// packed in float16 panels when `half`.
std::vector<float> float_gemm_check(const float* x, int rows, int k, const float* w, int n, bool half,
                                    const float* bias, bool gelu_tanh, const float* residual);
bool float16_panels_supported();

}  // namespace llmd
