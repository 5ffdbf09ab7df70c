// The few kernels the model's step needs besides the products and attention: picking the rows
// that return logits out of the residual stream, SwiGLU where gate and up could not be stacked
// into one matrix (their GGUF types differ), and Qwen's q/k/v biases and q/k norms.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace llmd::cuda {

// dst[i][:cols] = src[rows[i]][:cols] (row strides ld_src, ld_dst); rows on the device.
void copy_rows(const float* src, int ld_src, const int32_t* rows, int n, int cols, float* dst, int ld_dst,
               cudaStream_t stream);
// gate[r][i] = silu(gate[r][i]) * up[r][i] for n rows of cols values (row stride ld), in place.
void swiglu_inplace(float* gate, const float* up, int ld, int n, int cols, cudaStream_t stream);

// Qwen's extras on the q|k|v product rows (row stride ld), before RoPE: adds `bias` (q|k|v, may
// be null) to every row, then RMS-normalizes each q head by q_norm and each k head by k_norm
// (head_dim weights each; both null: no norm).
void qkv_bias_head_norm(float* qkv, int ld, int rows, int n_heads, int n_kv_heads, int head_dim, const float* bias,
                        const float* q_norm, const float* k_norm, float eps, cudaStream_t stream);

}  // namespace llmd::cuda
