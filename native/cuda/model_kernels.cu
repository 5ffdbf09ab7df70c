// See model_kernels.h.
#include "cuda_check.h"
#include "model_kernels.h"

namespace llmd::cuda {
namespace {

__global__ void copy_rows_kernel(const float* __restrict__ src, int ld_src, const int32_t* __restrict__ rows, int cols,
                                 float* __restrict__ dst, int ld_dst) {
  const int i = blockIdx.x;
  const float* s = src + static_cast<size_t>(rows[i]) * ld_src;
  float* d = dst + static_cast<size_t>(i) * ld_dst;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

__global__ void swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, int ld, int cols) {
  const size_t base = static_cast<size_t>(blockIdx.y) * ld;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    const float g = gate[base + c];
    gate[base + c] = g / (1.0f + __expf(-g)) * up[base + c];
  }
}

// One block per row: the bias over the whole row first, then one warp per q or k head.
__global__ void qkv_bias_head_norm_kernel(float* __restrict__ qkv, int ld, int n_heads, int n_kv_heads, int head_dim,
                                          const float* __restrict__ bias, const float* __restrict__ q_norm,
                                          const float* __restrict__ k_norm, float eps) {
  float* row = qkv + static_cast<size_t>(blockIdx.x) * ld;
  if (bias != nullptr) {
    const int dim = (n_heads + 2 * n_kv_heads) * head_dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) row[i] += bias[i];
    __syncthreads();
  }
  if (q_norm == nullptr) return;
  const int lane = threadIdx.x % 32;
  for (int h = threadIdx.x / 32; h < n_heads + n_kv_heads; h += blockDim.x / 32) {
    float* x = row + static_cast<size_t>(h) * head_dim;  // k heads follow the q heads
    const float* w = h < n_heads ? q_norm : k_norm;
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += x[i] * x[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) x[i] = x[i] * r * w[i];
  }
}

}  // namespace

void qkv_bias_head_norm(float* qkv, int ld, int rows, int n_heads, int n_kv_heads, int head_dim, const float* bias,
                        const float* q_norm, const float* k_norm, float eps, cudaStream_t stream) {
  if (rows <= 0 || (bias == nullptr && q_norm == nullptr)) return;
  qkv_bias_head_norm_kernel<<<rows, 256, 0, stream>>>(qkv, ld, n_heads, n_kv_heads, head_dim, bias, q_norm, k_norm,
                                                      eps);
  LLMD_CUDA_CHECK_LAUNCH();
}

void copy_rows(const float* src, int ld_src, const int32_t* rows, int n, int cols, float* dst, int ld_dst,
               cudaStream_t stream) {
  if (n <= 0) return;
  copy_rows_kernel<<<n, 256, 0, stream>>>(src, ld_src, rows, cols, dst, ld_dst);
  LLMD_CUDA_CHECK_LAUNCH();
}

void swiglu_inplace(float* gate, const float* up, int ld, int n, int cols, cudaStream_t stream) {
  if (n <= 0) return;
  const dim3 grid((cols + 255) / 256 < 64 ? (cols + 255) / 256 : 64, n);
  swiglu_kernel<<<grid, 256, 0, stream>>>(gate, up, ld, cols);
  LLMD_CUDA_CHECK_LAUNCH();
}

}  // namespace llmd::cuda
