// The AVX-512 kernel behind float_gemm.h (kernels/float_gemm_avx512.cpp, built only for x86).
#pragma once

namespace llmd::float_gemm_avx512 {

// Applied to each finished output, in this order: + bias[col], GELU-tanh, + residual[row][col]
// (residual row-major [rows, n], like the output).
struct Epilogue {
  const float* bias = nullptr;
  bool gelu_tanh = false;
  const float* residual = nullptr;
};

// out[rows, n] (row-major) for panels [p0, p1) of 16 output columns each: x [rows, k] @ W^T, W
// packed as float_gemm.h packs it, in float32 or (half) float16.
void gemm_panels(const float* x, int rows, int k, const void* panels, bool half, int n, int p0, int p1, float* out,
                 const Epilogue& e);

}  // namespace llmd::float_gemm_avx512
