// rope_write_kv (attention.h): RoPE on q and k and the float16 KV write, one launch per layer.
// A few thread blocks per new token, each with the token's rotation table (dims / 2 cos/sin pairs)
// in shared memory, shared by every q and k head it rotates, so the transcendental work is
// dims / 2 per token and block, not per head.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "cuda_check.h"

namespace llmd::cuda {
namespace {

constexpr int kRopeThreads = 128;

// Row `blockIdx.x` of qkv: q heads [0, n_heads), k heads [n_heads, n_heads + n_kv), then v.
// Angles: float(position) * inv_freq[i] in float, as llama.cpp forms them; sin/cos of that float
// angle after a range reduction in double: --use_fast_math turns sinf/cosf into the approximate
// __sinf/__cosf, whose error grows with the argument (positions of several thousand radians), and
// on [-pi, pi] it is ~1e-6.
__global__ void __launch_bounds__(kRopeThreads)
    rope_write_kv_kernel(float* __restrict__ qkv, int ld, int n_heads, int n_kv, int head_dim,
                         const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                         const float* __restrict__ inv_freq, int dims, bool interleaved, __half* __restrict__ kc,
                         __half* __restrict__ vc) {
  extern __shared__ float table[];  // cos [half], sin [half]
  const int row = blockIdx.x;
  const int half_dims = dims / 2;
  float* x = qkv + static_cast<size_t>(row) * ld;
  const int pos = positions[row];
  for (int i = threadIdx.x; i < half_dims; i += blockDim.x) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    // The float angle reduced to [-pi, pi] in double (exact enough: one multiply-subtract), then the
    // hardware sincos, whose error is ~1e-6 on that range. Double-precision sincos itself was the
    // kernel's cost: 9.5 us for one row on an H200, 0.3 ms of an 8B decode step.
    const double turns = rint(static_cast<double>(angle) * 0.15915494309189535);
    float s, c;
    __sincosf(static_cast<float>(fma(-turns, 6.283185307179586, static_cast<double>(angle))), &s, &c);
    table[i] = c;
    table[half_dims + i] = s;
  }
  __syncthreads();

  // A negative slot writes no KV (a padding row); its q and k are still rotated.
  const int slot = slots[row];
  const bool write_kv = slot >= 0;
  // The slot's base in [num_blocks][n_kv][kKvBlockTokens][head_dim] for KV head 0.
  const size_t slot_base = write_kv ? (static_cast<size_t>(slot / kKvBlockTokens) * n_kv * kKvBlockTokens +
                                       slot % kKvBlockTokens) *
                                          head_dim
                                    : 0;
  const size_t head_stride = static_cast<size_t>(kKvBlockTokens) * head_dim;

  // Rotated pairs of every q and k head; each thread owns whole pairs, so the in-place update
  // never races with another thread's read.
  const int rot_heads = n_heads + n_kv;
  const int first = blockIdx.y * blockDim.x + threadIdx.x;
  const int stride = blockDim.x * gridDim.y;
  for (int idx = first; idx < rot_heads * half_dims; idx += stride) {
    const int h = idx / half_dims;
    const int i = idx - h * half_dims;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half_dims;
    float* xh = x + static_cast<size_t>(h) * head_dim;
    const float x0 = xh[a];
    const float x1 = xh[b];
    const float c = table[i];
    const float s = table[half_dims + i];
    const float y0 = x0 * c - x1 * s;
    const float y1 = x0 * s + x1 * c;
    xh[a] = y0;
    xh[b] = y1;
    if (h >= n_heads && write_kv) {
      __half* kh = kc + slot_base + (h - n_heads) * head_stride;
      kh[a] = __float2half_rn(y0);
      kh[b] = __float2half_rn(y1);
    }
  }
  if (!write_kv) return;
  // k's unrotated tail (partial rotary; no thread above writes dims >= `dims`) and all of v.
  const float* xk = x + static_cast<size_t>(n_heads) * head_dim;
  const float* xv = xk + static_cast<size_t>(n_kv) * head_dim;
  for (int idx = first; idx < n_kv * head_dim; idx += stride) {
    const int h = idx / head_dim;
    const int d = idx - h * head_dim;
    const size_t dst = slot_base + h * head_stride + d;
    if (d >= dims) kc[dst] = __float2half_rn(xk[idx]);
    vc[dst] = __float2half_rn(xv[idx]);
  }
}

}  // namespace

void rope_write_kv(float* qkv, int ld, int rows, int n_heads, const int32_t* positions, const int32_t* slots,
                   const Rope& rope, const LayerKv& kv, cudaStream_t stream) {
  if (rows <= 0) return;
  if (rope.dims < 0 || rope.dims % 2 != 0 || rope.dims > kv.head_dim || (rope.dims > 0 && rope.inv_freq == nullptr))
    throw std::runtime_error("rope_write_kv: rope dims " + std::to_string(rope.dims) +
                             " must be even, <= head_dim " + std::to_string(kv.head_dim) + ", with inv_freq");
  if (ld < (n_heads + 2 * kv.n_kv_heads) * kv.head_dim)
    throw std::runtime_error("rope_write_kv: row stride " + std::to_string(ld) + " shorter than q|k|v");
  const size_t smem = static_cast<size_t>(rope.dims) * sizeof(float);
  // A row's pairs and values spread over several CTAs: with one CTA per row, each thread walked ~20
  // pairs of an 8B row whose in-place loads and stores the compiler must keep in order (they may
  // alias), one memory round trip after another: 9-15 us per call at decode on an H200. Every CTA
  // of a row builds the row's (small) rotation table itself.
  const int work = std::max((n_heads + kv.n_kv_heads) * (rope.dims / 2), kv.n_kv_heads * kv.head_dim);
  const int chunks = std::max(1, std::min((work + kRopeThreads - 1) / kRopeThreads, std::max(1, 4096 / rows)));
  rope_write_kv_kernel<<<dim3(rows, chunks), kRopeThreads, smem, stream>>>(qkv, ld, n_heads, kv.n_kv_heads, kv.head_dim, positions,
                                                              slots, rope.inv_freq, rope.dims, rope.interleaved, kv.k,
                                                              kv.v);
  LLMD_CUDA_CHECK_LAUNCH();
}

}  // namespace llmd::cuda
