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

}  // namespace

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
