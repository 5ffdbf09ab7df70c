// The decode path of matmul.h: the prologue (RMS norm + q8 quantization), the fused GEMV kernels over every weight
// format, and the small kernels around the prefill path (dequantization to float16, casts, SwiGLU) and
// gather_rows. Formats' readers: matmul_formats.cuh; layouts: matmul_internal.h.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "matmul.h"
#include "matmul_formats.cuh"
#include "matmul_internal.h"

namespace llmd::cuda {

using detail::ActView;
using detail::WeightView;

Activations::Activations(int max_rows, int max_cols)
    : max_rows_(max_rows),
      max_cols_(max_cols),
      f32_(size_t(max_rows) * max_cols * sizeof(float)),
      q8_(detail::q8_bytes(max_rows, max_cols)) {}

namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr int kPrologueThreads = 256;

// Grid (rows, chunks): CTA (row, c) writes the blocks of 32 values [c * blocks_per_cta, (c + 1) * blocks_per_cta)
// of its row. Pass 1 (with a norm): the sum of squares of the whole row (every CTA of the row computes it: a few
// KB from L2, cheaper than a second launch); pass 2: each warp takes blocks of 32 values, writes them as float32
// and as int8 codes with (d, d * sum of codes). Why chunks: at decode one row of 14336 values in one CTA is a
// serial loop of ~56 blocks per warp on one SM (~10 us, four such calls per layer); spread over ~50 CTAs it is a
// single pass. In place (x == out.f32(), ldx == cols) only with one CTA per row: every value is then read and
// written by the same thread, after the block's reduction barrier.
__global__ void __launch_bounds__(kPrologueThreads)
    rmsnorm_quantize_kernel(const float* x, int ldx, const float* norm_weight, float eps, int cols, int cols32,
                            int blocks_per_cta, float* f32, int8_t* codes, float2* ds) {
  const int row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* xr = x + size_t(row) * ldx;
  float scale = 1.0f;
  if (norm_weight != nullptr) {
    __shared__ float partial[kPrologueThreads / 32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += kPrologueThreads) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kPrologueThreads / 32; ++k) total += partial[k];
    scale = rsqrtf(total / float(cols) + eps);
  }
  const int nblk = cols32 / 32;
  const int last = min(nblk, (blockIdx.y + 1) * blocks_per_cta);
  for (int b = blockIdx.y * blocks_per_cta + warp; b < last; b += kPrologueThreads / 32) {
    const int i = b * 32 + lane;
    float v = 0.0f;
    if (i < cols) {
      v = xr[i] * scale;
      if (norm_weight != nullptr) v *= norm_weight[i];
      f32[size_t(row) * cols + i] = v;
    }
    const float amax = warp_max(fabsf(v));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q = max(-127, min(127, __float2int_rn(v * inv)));
    const float sum = warp_sum(float(q));
    codes[size_t(row) * cols32 + i] = static_cast<int8_t>(q);
    if (lane == 0) ds[size_t(row) * nblk + b] = make_float2(amax / 127.0f, amax / 127.0f * sum);
  }
}

ActView act_view(const Activations& x) {
  const int cols32 = detail::round_up(x.cols, 32);
  auto* base = static_cast<uint8_t*>(x.q8());
  return {base, reinterpret_cast<const float2*>(base + detail::q8_ds_offset(x.max_rows(), x.max_cols())), x.f32(),
          cols32, cols32 / 32, x.cols, x.rows};
}

constexpr int kGemvWarps = 4;
enum : int { kEpiStore = 0, kEpiAdd = 1, kEpiSwiGLU = 2 };

// One warp per pair of weight rows (Store/Add: rows 2w and 2w + 1; SwiGLU: gate row w and up row w + rows / 2), all
// N activation rows at once: each lane loads kU units of both rows (every 16-byte load issued before the first
// use), then dots them with every activation row, so each weight byte is read from DRAM once per launch. N is the
// activation row count rounded up to a compiled size; rows past x.n repeat row x.n - 1 (never written).
template <class F, int N>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(WeightView w, ActView x, float* __restrict__ y, int ldy, int epi) {
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  int ra, rb;
  if (epi == kEpiSwiGLU) {
    if (warp >= w.rows / 2) return;
    ra = warp;
    rb = warp + w.rows / 2;
  } else {
    ra = 2 * warp;
    if (ra >= w.rows) return;
    rb = min(ra + 1, w.rows - 1);
  }
  float acc_a[N], acc_b[N];
#pragma unroll
  for (int r = 0; r < N; ++r) acc_a[r] = acc_b[r] = 0.0f;

  // Units per lane per chunk: the format's choice for few rows (bytes in flight), one for many (2 x N accumulators
  // already hold 32-64 registers, and with 16+ rows the dot products, not the loads, set the pace).
  constexpr int kU = N >= 16 ? 1 : F::kU;
  const int units = F::units(w.cols);
  // One chunk: kU units of each row per lane. With N <= 2, full chunks run unguarded (one basic block, so the
  // scheduler may issue the activation loads alongside the weight loads) and only the last, partial chunk checks
  // u < units.
  auto chunk = [&](int base, auto guarded) {
    constexpr bool kGuard = decltype(guarded)::value;
    typename F::Unit ua[kU], ub[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int u = base + 32 * k + lane;
      if (!kGuard || u < units) {
        F::load(w, ra, u, ua[k]);
        F::load(w, rb, u, ub[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int u = base + 32 * k + lane;
      if (!kGuard || u < units) {
        F::prep(ua[k], u);
        F::prep(ub[k], u);
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int u = base + 32 * k + lane;
      if (!kGuard || u < units) {
#pragma unroll
        for (int r = 0; r < N; ++r) F::dot2(ua[k], ub[k], x, min(r, x.n - 1), u, acc_a[r], acc_b[r]);
      }
    }
  };
  if constexpr (N <= 2) {  // the decode hot path, latency-bound
    int base = 0;
    for (; base + 32 * kU <= units; base += 32 * kU) chunk(base, std::false_type{});
    if (base < units) chunk(base, std::true_type{});  // at most one partial chunk is left
  } else {  // more rows: the guarded form alone needs fewer registers
    for (int base = 0; base < units; base += 32 * kU) chunk(base, std::true_type{});
  }
#pragma unroll
  for (int r = 0; r < N; ++r) {
    acc_a[r] = warp_sum(acc_a[r]);
    acc_b[r] = warp_sum(acc_b[r]);
  }
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r < x.n && lane == (r & 31)) {
      float* yr = y + size_t(r) * ldy;
      if (epi == kEpiSwiGLU) {
        const float g = acc_a[r];
        yr[ra] = g / (1.0f + __expf(-g)) * acc_b[r];
      } else if (epi == kEpiAdd) {
        yr[ra] += acc_a[r];
        if (ra + 1 < w.rows) yr[ra + 1] += acc_b[r];
      } else {
        yr[ra] = acc_a[r];
        if (ra + 1 < w.rows) yr[ra + 1] = acc_b[r];
      }
    }
  }
}

template <class F>
void launch_gemv(const DeviceMatrix& w, const ActView& x, float* y, int ldy, int epi, cudaStream_t stream) {
  const int warps = epi == kEpiSwiGLU ? w.rows / 2 : (w.rows + 1) / 2;
  const dim3 grid((warps + kGemvWarps - 1) / kGemvWarps), block(kGemvWarps * 32);
  const WeightView v = detail::view(w);
  // The compiled batch sizes: exact up to 4, then multiples of 8 (a padded row costs arithmetic, not bandwidth).
  if (x.n <= 1) gemv_kernel<F, 1><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else if (x.n <= 2) gemv_kernel<F, 2><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else if (x.n <= 3) gemv_kernel<F, 3><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else if (x.n <= 4) gemv_kernel<F, 4><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else if (x.n <= 8) gemv_kernel<F, 8><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else if (x.n <= 16) gemv_kernel<F, 16><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else if (x.n <= 24) gemv_kernel<F, 24><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  else gemv_kernel<F, 32><<<grid, block, 0, stream>>>(v, x, y, ldy, epi);
  LLMD_CUDA_CHECK_LAUNCH();
}

// One thread per 32 weights of a row.
template <class F>
__global__ void dequantize_f16_kernel(WeightView w, __half* out) {
  const int nb = w.cols / 32;
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= size_t(w.rows) * nb) return;
  const int row = int(t / nb), b = int(t % nb);
  float v[32];
  F::dequant32(w, row, b, v);
  uint4* dst = reinterpret_cast<uint4*>(out + size_t(row) * w.cols + size_t(b) * 32);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    __half2 h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(v[8 * k + 2 * j], v[8 * k + 2 * j + 1]);
    dst[k] = *reinterpret_cast<uint4*>(h);
  }
}

template <class F>
__global__ void gather_kernel(WeightView w, const int32_t* ids, int n, float* out) {
  const int nb = w.cols / 32;
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= size_t(n) * nb) return;
  const int i = int(t / nb), b = int(t % nb);
  const int row = ids[i];
  float v[32];
  if (row >= 0 && row < w.rows) {
    F::dequant32(w, row, b, v);
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = 0.0f;  // an id out of range reads nothing rather than fault
  }
  float4* dst = reinterpret_cast<float4*>(out + size_t(i) * w.cols + size_t(b) * 32);
#pragma unroll
  for (int k = 0; k < 8; ++k) dst[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
}

__global__ void f32_to_f16_kernel(const float* x, int ldx, int rows, int cols, __half* out) {
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= size_t(rows) * cols) return;
  const int r = int(t / cols), c = int(t % cols);
  out[t] = __float2half_rn(x[size_t(r) * ldx + c]);
}

__global__ void swiglu_kernel(const float* t, int rows, int half, float* y, int ldy) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * half) return;
  const int r = int(i / half), c = int(i % half);
  const float g = t[size_t(r) * 2 * half + c], u = t[size_t(r) * 2 * half + half + c];
  y[size_t(r) * ldy + c] = g / (1.0f + __expf(-g)) * u;
}

unsigned blocks_for(size_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void rmsnorm_quantize(const float* x, int ldx, const float* norm_weight, float eps, int rows, int cols,
                      Activations& out, cudaStream_t stream) {
  if (rows > out.max_rows() || cols > out.max_cols())
    throw std::invalid_argument("rmsnorm_quantize: " + std::to_string(rows) + "x" + std::to_string(cols) +
                                " exceeds the activations' " + std::to_string(out.max_rows()) + "x" +
                                std::to_string(out.max_cols()));
  out.rows = rows;
  out.cols = cols;
  if (rows == 0) return;
  const int cols32 = detail::round_up(cols, 32);
  auto* base = static_cast<uint8_t*>(out.q8());
  // Few rows (decode): each row's blocks spread over up to ~2 waves of CTAs of 8 blocks (one per warp). Many rows
  // (prefill), or in place: one CTA per row.
  const int nblk = cols32 / 32;
  int chunks = 1;
  if (rows < 64 && x != out.f32()) chunks = std::max(1, std::min((nblk + 7) / 8, 264 / rows));
  const int blocks_per_cta = (nblk + chunks - 1) / chunks;
  chunks = (nblk + blocks_per_cta - 1) / blocks_per_cta;
  rmsnorm_quantize_kernel<<<dim3(rows, chunks), kPrologueThreads, 0, stream>>>(
      x, ldx, norm_weight, eps, cols, cols32, blocks_per_cta, out.f32(), reinterpret_cast<int8_t*>(base),
      reinterpret_cast<float2*>(base + detail::q8_ds_offset(out.max_rows(), out.max_cols())));
  LLMD_CUDA_CHECK_LAUNCH();
}

void matmul(MatmulContext& ctx, const DeviceMatrix& w, const Activations& x, float* y, int ldy, Epilogue epilogue,
            cudaStream_t stream) {
  if (x.cols != w.cols)
    throw std::invalid_argument("matmul: activations have " + std::to_string(x.cols) + " columns, the matrix " +
                                std::to_string(w.cols));
  if (epilogue == Epilogue::SwiGLU && w.rows % 2 != 0) throw std::invalid_argument("matmul: SwiGLU needs even rows");
  if (x.rows == 0 || w.rows == 0) return;
  if (x.rows > gemv_row_limit()) {
    detail::prefill_matmul(ctx, w, x, y, ldy, epilogue, stream);
    return;
  }
  if (detail::use_mma(w, x.rows)) {
    detail::mma_matmul(w, x, y, ldy, epilogue, stream);
    return;
  }
  const int epi = epilogue == Epilogue::Store ? kEpiStore : epilogue == Epilogue::Add ? kEpiAdd : kEpiSwiGLU;
  const ActView av = act_view(x);
  detail::dispatch_format(w.format, [&]<class F>() { launch_gemv<F>(w, av, y, ldy, epi, stream); });
}

void gather_rows(const DeviceMatrix& w, const int32_t* ids, int n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  const size_t threads = size_t(n) * (w.cols / 32);
  const WeightView v = detail::view(w);
  detail::dispatch_format(w.format, [&]<class F>() {
    gather_kernel<F><<<blocks_for(threads, 256), 256, 0, stream>>>(v, ids, n, out);
  });
  LLMD_CUDA_CHECK_LAUNCH();
}

namespace detail {

void launch_dequantize_f16(const DeviceMatrix& w, __half* out, cudaStream_t stream) {
  const size_t threads = size_t(w.rows) * (w.cols / 32);
  const WeightView v = view(w);
  dispatch_format(w.format, [&]<class F>() {
    dequantize_f16_kernel<F><<<blocks_for(threads, 256), 256, 0, stream>>>(v, out);
  });
  LLMD_CUDA_CHECK_LAUNCH();
}

void launch_f32_to_f16(const float* x, int ldx, int rows, int cols, __half* out, cudaStream_t stream) {
  f32_to_f16_kernel<<<blocks_for(size_t(rows) * cols, 256), 256, 0, stream>>>(x, ldx, rows, cols, out);
  LLMD_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(const float* t, int rows, int half, float* y, int ldy, cudaStream_t stream) {
  swiglu_kernel<<<blocks_for(size_t(rows) * half, 256), 256, 0, stream>>>(t, rows, half, y, ldy);
  LLMD_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace llmd::cuda
