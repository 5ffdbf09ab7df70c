// The few kernels the model's step needs besides the products and attention: picking the rows
// that return logits out of the residual stream, and SwiGLU where gate and up could not be
// stacked into one matrix (their GGUF types differ).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace llmd::cuda {

// dst[i][:cols] = src[rows[i]][:cols] (row strides ld_src, ld_dst); rows on the device.
void copy_rows(const float* src, int ld_src, const int32_t* rows, int n, int cols, float* dst, int ld_dst,
               cudaStream_t stream);
// gate[r][i] = silu(gate[r][i]) * up[r][i] for n rows of cols values (row stride ld), in place.
void swiglu_inplace(float* gate, const float* up, int ld, int n, int cols, cudaStream_t stream);

}  // namespace llmd::cuda
