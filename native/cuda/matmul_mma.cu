// The batched-decode product of matmul.h (9..kMaxGemvBatch activation rows, quantized formats) on the tensor cores:
// mma.sync m16n8k16 (float16 in, float32 accumulate), weights dequantized straight into A fragments in registers.
//
// Why not the GEMV: at 32 rows it dots every weight unit with every activation row in dp4a, re-reading the
// activations from L1 for each pair of weight rows (L1-bound: 4-9% of the copy bandwidth). Why not dequantize +
// cuBLAS: the float16 copy of every matrix is written and read every step (0.46x llama.cpp). Here each weight byte
// is read from DRAM once, decoded once into registers, and multiplied on the tensor cores; the activations, shared by
// all of a CTA's weight rows, are staged once per CTA and K chunk in shared memory.
//
// Launch shape: 128 threads (4 warps) per CTA, a CTA per tile of 64 MT weight rows (MT = 2 for Store/Add, 1 for
// SwiGLU: 32 gate rows and the matching 32 up rows, so the epilogue has both), N = 16 or 32 activation rows (x.n
// rounded up; padding rows are zero and never written). Warp w owns tile rows [16 MT w, +16 MT): MT m16 tiles x N/8
// n8 tiles of accumulators. K runs in groups of 128 (4 blocks of 32); thread (g = lane / 4, q = lane % 4) decodes
// block q of the group for its warp's rows g, g + 8 (, g + 16, g + 24): 32 weights each, exactly the A fragments of
// the 8 k16 steps of the group once K is permuted inside the group. The permutation (same for A and B, so the dot
// product is unchanged):
//   mma step s (0..7), fragment column pair of thread q, slot j (0..3: a0 a1 | a4 a5) <-> k = 32q + 4s + j,
// i.e. each thread's four A values of a step are 4 consecutive weights of its own block: no shuffles, no shared
// memory for the weights. The activations are stored in shared memory in the matching order (see store_x), so a
// thread's B fragments of steps 2u and 2u + 1 are one 16-byte load.
//
// Activations: the q8 codes times their block scale (the GEMV's numerics; float16 keeps the 8-bit codes exactly),
// double-buffered in shared memory: the next group's codes are loaded into registers before this group's weights
// are decoded, stored after its mma, one barrier per group.
//
// Split K: matrices with few row tiles (4096-row outputs: 32 tiles) would leave most of the 132 SMs idle, so the K
// groups are split over gridDim.y CTAs whose partial sums are atomically added into y (Store: y zeroed first by a
// memset on the same stream; Add: added onto the residual directly). Graph-capturable (a memset node and a kernel
// node), but the float summation order varies from run to run. SwiGLU (nonlinear) never splits; its gate|up matrix
// has hundreds of tiles anyway.
//
// F16 weights stay on the GEMV: it multiplies by the float32 activations (~1e-6 relative error), which float16
// activations here would lose (~3e-4), and no quantized model's hot matrices are F16.
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda_check.h"
#include "matmul.h"
#include "matmul_formats.cuh"
#include "matmul_internal.h"

namespace llmd::cuda::detail {
namespace {

constexpr int kMmaThreads = 128;
constexpr int kGroupK = 128;    // K per group: 4 blocks of 32
// Activation row stride in shared memory, in halves: 128 + 32 padding. 320 bytes = 64 mod 128, so the 16-byte B
// loads of a quarter warp (rows g, g + 1; q = 0..3 at 16-byte steps) cover all 32 banks once.
constexpr int kXStride = kGroupK + 32;
enum : int { kEpiStore = 0, kEpiAdd = 1, kEpiSwiGLU = 2 };

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// Block `blk` (32 weights) of weight row `row` as float16 pairs: o[i] = (v[2i], v[2i + 1]). The default goes through
// the format's dequant32 (float, then rounded to float16); the hot formats have their own, which build float16 from
// the bits (0x6400 | n is the float16 1024 + n) and so avoid the quarter-rate integer-to-float conversions.
template <class F>
struct MmaDec {
  __device__ static void dec(const WeightView& w, int row, int blk, __half2 (&o)[16]) {
    float v[32];
    F::dequant32(w, row, blk, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  }
};

// Q4_0: byte j holds weight j (low nibble) and weight j + 16 (high); w = d * (n - 8). The subtraction of 1032 is
// exact in float16 and the product with d rounds once, as the float path's final rounding does.
template <>
struct MmaDec<FmtQ4_0> {
  __device__ static void dec(const WeightView& w, int row, int blk, __half2 (&o)[16]) {
    const size_t i = size_t(row) * (w.cols / 32) + blk;
    const uint4 q = ld_w16(w.data + i * 16);
    const __half d = __ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(w.aux) + i));
    const __half2 d2 = __half2half2(d), off = __float2half2_rn(1032.0f);
    auto f = [&](uint32_t n2) { return __hmul2(__hsub2(bits_h2(n2 | 0x64006400u), off), d2); };
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t wd = word(q, k);
      const uint32_t b01 = __byte_perm(wd, 0, 0x4140);  // [byte 4k, 0, byte 4k+1, 0]
      const uint32_t b23 = __byte_perm(wd, 0, 0x4342);  // [byte 4k+2, 0, byte 4k+3, 0]
      o[2 * k] = f(b01 & 0x000F000Fu);                  // weights 4k, 4k+1
      o[2 * k + 1] = f(b23 & 0x000F000Fu);              // 4k+2, 4k+3
      o[8 + 2 * k] = f((b01 >> 4) & 0x000F000Fu);       // 16+4k, 16+4k+1
      o[9 + 2 * k] = f((b23 >> 4) & 0x000F000Fu);       // 16+4k+2, 16+4k+3
    }
  }
};

// Q8_0: int8 b -> (b ^ 0x80) = b + 128 in the low byte of the float16 0x64xx = 1024 + b + 128.
template <>
struct MmaDec<FmtQ8_0> {
  __device__ static void dec(const WeightView& w, int row, int blk, __half2 (&o)[16]) {
    const size_t i = size_t(row) * (w.cols / 32) + blk;
    const uint4 q0 = ld_w16(w.data + i * 32), q1 = ld_w16(w.data + i * 32 + 16);
    const __half d = __ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(w.aux) + i));
    const __half2 d2 = __half2half2(d), off = __float2half2_rn(1152.0f);
    auto f = [&](uint32_t u) { return __hmul2(__hsub2(bits_h2(u), off), d2); };
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t w0 = word(q0, k) ^ 0x80808080u, w1 = word(q1, k) ^ 0x80808080u;
      o[2 * k] = f(__byte_perm(w0, 0x64646464u, 0x5140));      // [b0, 0x64, b1, 0x64]: weights 4k, 4k+1
      o[2 * k + 1] = f(__byte_perm(w0, 0x64646464u, 0x7362));  // [b2, 0x64, b3, 0x64]
      o[8 + 2 * k] = f(__byte_perm(w1, 0x64646464u, 0x5140));  // weights 16+4k, ...
      o[9 + 2 * k] = f(__byte_perm(w1, 0x64646464u, 0x7362));
    }
  }
};

// Q4_K: sub-block j = blk % 8 of super-block blk / 8: weights l and l + 16 are nibble (j & 1) of bytes l of the two
// 16-byte halves of qs[32 (j / 2), +32); w = sc * n - m, with sc and m rounded to float16 (2^-12 relative each, far
// below the q8 activations' error) and one fused rounding of n * sc - m.
template <>
struct MmaDec<FmtQ4_K> {
  __device__ static void dec(const WeightView& w, int row, int blk, __half2 (&o)[16]) {
    const uint8_t* b = w.data + (size_t(row) * (w.cols / 256) + blk / 8) * 144;
    const uint4 h = ld_w16(b);
    const int j = blk % 8;
    const uint4 q0 = ld_w16(b + 16 + 32 * (j / 2)), q1 = ld_w16(b + 32 + 32 * (j / 2));
    float sc, m;
    kscale_min(h, j, sc, m);
    const __half2 sc2 = __float2half2_rn(sc), nm2 = __float2half2_rn(-m), off = __float2half2_rn(1024.0f);
    const int shift = (j & 1) * 4;
    auto f = [&](uint32_t n2) { return __hfma2(__hsub2(bits_h2(n2 | 0x64006400u), off), sc2, nm2); };
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t w0 = word(q0, k) >> shift, w1 = word(q1, k) >> shift;
      o[2 * k] = f(__byte_perm(w0, 0, 0x4140) & 0x000F000Fu);
      o[2 * k + 1] = f(__byte_perm(w0, 0, 0x4342) & 0x000F000Fu);
      o[8 + 2 * k] = f(__byte_perm(w1, 0, 0x4140) & 0x000F000Fu);
      o[9 + 2 * k] = f(__byte_perm(w1, 0, 0x4342) & 0x000F000Fu);
    }
  }
};

// Q5_K: as Q4_K, the fifth bit of weight l (l + 16) is bit j of qh byte l (l + 16).
template <>
struct MmaDec<FmtQ5_K> {
  __device__ static void dec(const WeightView& w, int row, int blk, __half2 (&o)[16]) {
    const uint8_t* b = w.data + (size_t(row) * (w.cols / 256) + blk / 8) * 176;
    const uint4 h = ld_w16(b);
    const int j = blk % 8;
    const uint4 h0 = ld_w16(b + 16), h1 = ld_w16(b + 32);
    const uint4 q0 = ld_w16(b + 48 + 32 * (j / 2)), q1 = ld_w16(b + 64 + 32 * (j / 2));
    float sc, m;
    kscale_min(h, j, sc, m);
    const __half2 sc2 = __float2half2_rn(sc), nm2 = __float2half2_rn(-m), off = __float2half2_rn(1024.0f);
    const int shift = (j & 1) * 4;
    auto f = [&](uint32_t n2) { return __hfma2(__hsub2(bits_h2(n2 | 0x64006400u), off), sc2, nm2); };
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // the 5-bit values of weights 4k..4k+3 (v0) and 16+4k.. (v1), one per byte
      const uint32_t v0 = ((word(q0, k) >> shift) & 0x0F0F0F0Fu) | (((word(h0, k) >> j) & 0x01010101u) << 4);
      const uint32_t v1 = ((word(q1, k) >> shift) & 0x0F0F0F0Fu) | (((word(h1, k) >> j) & 0x01010101u) << 4);
      o[2 * k] = f(__byte_perm(v0, 0, 0x4140));
      o[2 * k + 1] = f(__byte_perm(v0, 0, 0x4342));
      o[8 + 2 * k] = f(__byte_perm(v1, 0, 0x4140));
      o[9 + 2 * k] = f(__byte_perm(v1, 0, 0x4342));
    }
  }
};

// Q6_K (re-laid: ql[128] qh[64] scales[16], d apart): block blk % 8 = 4 n + g of the super-block; weights l and
// l + 16 from ql bytes l of [64 n + 32 (g & 1), +16) and [+16, +32) (nibble g / 2), qh bytes l of [128 + 32 n, +16)
// and [+16, +32) (bits 2g, 2g + 1); scales 2g and 2g + 1 of the 8 at 192 + 8n. w = d * scale * (q - 32), with
// d * scale rounded to float16 (2^-12 relative) and one rounding of the product.
template <>
struct MmaDec<FmtQ6_K> {
  __device__ static void dec(const WeightView& w, int row, int blk, __half2 (&o)[16]) {
    const size_t bi = size_t(row) * (w.cols / 256) + blk / 8;
    const uint8_t* b = w.data + bi * 208;
    const int n = (blk % 8) / 4, g = blk % 4;
    const uint4 l0 = ld_w16(b + 64 * n + (g & 1) * 32), l1 = ld_w16(b + 64 * n + (g & 1) * 32 + 16);
    const uint4 h0 = ld_w16(b + 128 + 32 * n), h1 = ld_w16(b + 128 + 32 * n + 16);
    const uint2 scw = ld_w8(b + 192 + 8 * n);
    const float d = ld_half(w.aux, bi);
    auto scale = [&](int k) {  // scales[8n + k], k = 0-7
      return float(static_cast<int8_t>(((k < 4 ? scw.x : scw.y) >> (8 * (k & 3))) & 0xFF));
    };
    const __half2 s0 = __float2half2_rn(d * scale(2 * g)), s1 = __float2half2_rn(d * scale(2 * g + 1));
    const __half2 off = __float2half2_rn(1056.0f);
    const int shift = g >= 2 ? 4 : 0;
    auto f = [&](uint32_t n2, __half2 s2) { return __hmul2(__hsub2(bits_h2(n2 | 0x64006400u), off), s2); };
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // the 6-bit values of weights 4k..4k+3 (v0) and 16+4k.. (v1), one per byte
      const uint32_t v0 = ((word(l0, k) >> shift) & 0x0F0F0F0Fu) | (((word(h0, k) >> (2 * g)) & 0x03030303u) << 4);
      const uint32_t v1 = ((word(l1, k) >> shift) & 0x0F0F0F0Fu) | (((word(h1, k) >> (2 * g)) & 0x03030303u) << 4);
      o[2 * k] = f(__byte_perm(v0, 0, 0x4140), s0);
      o[2 * k + 1] = f(__byte_perm(v0, 0, 0x4342), s0);
      o[8 + 2 * k] = f(__byte_perm(v1, 0, 0x4140), s1);
      o[9 + 2 * k] = f(__byte_perm(v1, 0, 0x4342), s1);
    }
  }
};

// Bytes of `data` per 32 weights of a row (every format's rows are contiguous in `data`, K-quant super-blocks
// included: 144 / 176 / 208 bytes per 256): where a row's bytes for a K group lie, for the L2 prefetch.
template <class F> inline constexpr int kDataBytes32 = 0;
template <> inline constexpr int kDataBytes32<FmtQ4_0> = 16;
template <> inline constexpr int kDataBytes32<FmtQ8_0> = 32;
template <> inline constexpr int kDataBytes32<FmtQ4_K> = 18;
template <> inline constexpr int kDataBytes32<FmtQ5_K> = 22;
template <> inline constexpr int kDataBytes32<FmtQ6_K> = 26;
template <> inline constexpr int kDataBytes32<FmtMlx4> = 16;
template <> inline constexpr int kDataBytes32<FmtMlx8> = 32;
template <> inline constexpr int kDataBytes32<FmtF16> = 64;

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Signed byte e (0-3) of u as an exact float: 2^23 + (byte ^ 0x80) in a float's mantissa, minus 2^23 + 128 (full-rate
// integer and float ops instead of the quarter-rate I2F).
__device__ __forceinline__ float sbyte_f(uint32_t flipped, int e) {
  return __int_as_float(int(__byte_perm(flipped, 0x4B000000u, 0x7540 + e))) - 8388736.0f;
}

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Grid (row tiles, K splits); split y takes K groups [y * groups_per_split, +groups_per_split). NB: 16 or 32
// activation rows; MT: m16 tiles per warp (tile of 64 MT weight rows).
// At least 3 CTAs (12 warps) per SM with MT = 2, 4 with MT = 1: their weight loads overlap each other's decode and
// mma (a CTA's own loads of a group are consumed right away); caps registers at 168 / 128, which every format meets
// with at most a few spilled bytes.
template <class F, int NB, int MT>
__global__ void __launch_bounds__(kMmaThreads, MT == 1 ? 4 : 3)
    mma_kernel(WeightView w, ActView x, float* __restrict__ y, int ldy, int epi, int groups_per_split) {
  constexpr int NT = NB / 8;  // n8 tiles
  constexpr int kTileRows = 64 * MT;
  constexpr int kRowsPerThread = 2 * MT;
  constexpr int kPieces = NB * kGroupK / 8 / kMmaThreads;  // 8-code pieces of the activation tile per thread
  __shared__ __align__(16) __half xs[2][NB][kXStride];
  __shared__ float cs[kTileRows][NB + 1];  // the output tile, [weight row][activation row]; odd stride: no conflicts

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x;
  const int nblk = w.cols / 32;
  const int ngroups = (nblk + 3) / 4;
  const int g_begin = blockIdx.y * groups_per_split;
  const int g_end = min(ngroups, g_begin + groups_per_split);  // the host makes every split non-empty
  const bool swiglu = epi == kEpiSwiGLU;
  const int half_rows = w.rows / 2;

  // Tile row lr's matrix row, clamped into the matrix (rows past the end decode a real row; the epilogue drops them).
  auto tile_row = [&](int lr) {
    if (swiglu) {
      const int j = min(tile * (kTileRows / 2) + (lr % (kTileRows / 2)), half_rows - 1);
      return j + (lr >= kTileRows / 2 ? half_rows : 0);
    }
    return min(tile * kTileRows + lr, w.rows - 1);
  };
  // This thread's 2 MT weight rows: tile rows 16 MT warp + 8 i + g (i = 2 mt + hi: m16 tile mt, fragment half hi).
  int wrow[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) wrow[i] = tile_row(16 * MT * warp + 8 * i + g);

  // Activation piece p: row n = idx / 16, block qq = idx % 4 of the group, 8-run t = (idx / 4) % 4 of the block
  // (k = 32 qq + 8 t .. +7), stored at halves 32 t + 8 qq of row n: with s = 2t + e / 4 and j = e % 4 that is
  // 32 (s / 2) + 8 qq + 4 (s % 2) + j, where thread qq's B fragment of step s expects k = 32 qq + 4 s + j.
  // (qq fastest: a quarter warp's 16-byte stores are 8 consecutive 16-byte slots, conflict-free.)
  uint2 xc[kPieces];
  float xd[kPieces];
  auto load_x = [&](int grp) {
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      const int idx = tid + kMmaThreads * p;
      const int n = idx >> 4, t = (idx >> 2) & 3, qq = idx & 3;
      const int blk = grp * 4 + qq;
      if (n < x.n && blk < nblk) {
        xc[p] = __ldg(reinterpret_cast<const uint2*>(x.codes + size_t(n) * x.cols32 + size_t(blk) * 32 + 8 * t));
        xd[p] = __ldg(&x.ds[size_t(n) * x.nblk + blk].x);
      } else {
        xc[p] = make_uint2(0, 0);  // zero codes and scale: padding rows and blocks past K contribute 0, never NaN
        xd[p] = 0.0f;
      }
    }
  };
  auto store_x = [&](int buf) {
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      const int idx = tid + kMmaThreads * p;
      const int n = idx >> 4, t = (idx >> 2) & 3, qq = idx & 3;
      const uint32_t c0 = xc[p].x ^ 0x80808080u, c1 = xc[p].y ^ 0x80808080u;
      uint4 v;
      v.x = h2_bits(__floats2half2_rn(sbyte_f(c0, 0) * xd[p], sbyte_f(c0, 1) * xd[p]));
      v.y = h2_bits(__floats2half2_rn(sbyte_f(c0, 2) * xd[p], sbyte_f(c0, 3) * xd[p]));
      v.z = h2_bits(__floats2half2_rn(sbyte_f(c1, 0) * xd[p], sbyte_f(c1, 1) * xd[p]));
      v.w = h2_bits(__floats2half2_rn(sbyte_f(c1, 2) * xd[p], sbyte_f(c1, 3) * xd[p]));
      *reinterpret_cast<uint4*>(&xs[buf][n][32 * t + 8 * qq]) = v;
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  // A group's weights are consumed right after their loads are issued; prefetching them into L2 one to two groups
  // ahead keeps DRAM requests in flight through each group's decode, mma and barrier (a hint: no registers held
  // across the loop but one pointer, no effect on results). A row's bytes of a group are contiguous and at most 128
  // (Q8_0), so its first and last byte name every line they touch: thread tid covers tile row tid % kTileRows (MT =
  // 1: two threads per row, one end each).
  const uint8_t* pf_row = w.data + size_t(tile_row(tid % kTileRows)) * nblk * kDataBytes32<F>;
  auto prefetch_group = [&](int grp) {
    if (grp >= g_end) return;
    const int b0 = grp * 4, b1 = min(grp * 4 + 4, nblk);
    const uint8_t* first = pf_row + size_t(b0) * kDataBytes32<F>;
    const uint8_t* last = pf_row + size_t(b1) * kDataBytes32<F> - 1;
    if (MT == 2) {
      prefetch_l2(first);
      prefetch_l2(last);
    } else {
      prefetch_l2(tid < kTileRows ? first : last);
    }
  };
  prefetch_group(g_begin + 1);
  load_x(g_begin);
  store_x(0);
  __syncthreads();
  for (int grp = g_begin; grp < g_end; ++grp) {
    const int cur = (grp - g_begin) & 1;
    prefetch_group(grp + 2);
    if (grp + 1 < g_end) load_x(grp + 1);  // in flight during this group's decode and mma

    __half2 a[kRowsPerThread][16];  // [row i][pair]: pair 2s = slots 0,1 of step s, 2s + 1 = slots 2,3
    const int blk = grp * 4 + q;
    if (blk < nblk) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) MmaDec<F>::dec(w, wrow[i], blk, a[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int k = 0; k < 16; ++k) a[i][k] = __float2half2_rn(0.0f);
    }

#pragma unroll
    for (int u = 0; u < 4; ++u) {  // steps 2u, 2u + 1
      uint4 b[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) b[nt] = *reinterpret_cast<const uint4*>(&xs[cur][nt * 8 + g][32 * u + 8 * q]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * u + h;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          // a0 a1: row g, slots 0,1; a2 a3: row g + 8, slots 0,1; a4 a5: row g, slots 2,3; a6 a7: row g + 8, 2,3.
          const uint32_t a0 = h2_bits(a[2 * mt][2 * s]), a1 = h2_bits(a[2 * mt + 1][2 * s]);
          const uint32_t a2 = h2_bits(a[2 * mt][2 * s + 1]), a3 = h2_bits(a[2 * mt + 1][2 * s + 1]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            // b0 b1: k slots 0,1 of activation row g; b2 b3: slots 2,3.
            const uint32_t b0 = h ? b[nt].z : b[nt].x, b1 = h ? b[nt].w : b[nt].y;
            mma_16816(acc[mt][nt], a0, a1, a2, a3, b0, b1);
          }
        }
      }
    }

    if (grp + 1 < g_end) store_x(cur ^ 1);
    // Orders this group's reads of xs[cur] before the next group's stores into it, and the stores into xs[cur ^ 1]
    // before the next group's reads.
    __syncthreads();
  }

  // C fragment: c0 c1 at (row g, columns 2q, 2q + 1), c2 c3 at (row g + 8, same columns); row = weight row within
  // the m16 tile, column = activation row.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int m = 16 * MT * warp + 16 * mt + g, n = nt * 8 + 2 * q;
      cs[m][n] = acc[mt][nt][0];
      cs[m][n + 1] = acc[mt][nt][1];
      cs[m + 8][n] = acc[mt][nt][2];
      cs[m + 8][n + 1] = acc[mt][nt][3];
    }
  __syncthreads();

  // Consecutive threads take consecutive weight rows of one activation row: coalesced y accesses.
  if (swiglu) {
    constexpr int kHalf = kTileRows / 2;
    for (int idx = tid; idx < kHalf * NB; idx += kMmaThreads) {
      const int n = idx / kHalf, m = idx % kHalf;
      const int i = tile * kHalf + m;
      if (n < x.n && i < half_rows) {
        const float gate = cs[m][n], up = cs[kHalf + m][n];
        y[size_t(n) * ldy + i] = gate / (1.0f + __expf(-gate)) * up;
      }
    }
  } else {
    const bool split = gridDim.y > 1;
    for (int idx = tid; idx < kTileRows * NB; idx += kMmaThreads) {
      const int n = idx / kTileRows, m = idx % kTileRows;
      const int row = tile * kTileRows + m;
      if (n < x.n && row < w.rows) {
        float* p = y + size_t(n) * ldy + row;
        const float v = cs[m][n];
        if (split) atomicAdd(p, v);
        else if (epi == kEpiAdd) *p += v;
        else *p = v;
      }
    }
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      sms = 132;
    return sms;
  }();
  return n;
}

template <class F, int MT>
void launch_mma_tiles(const DeviceMatrix& w, const ActView& x, float* y, int ldy, int epi, cudaStream_t stream) {
  constexpr int kTileRows = 64 * MT;
  const bool swiglu = epi == kEpiSwiGLU;
  const int tiles = swiglu ? (w.rows / 2 + kTileRows / 2 - 1) / (kTileRows / 2) : (w.rows + kTileRows - 1) / kTileRows;
  const int ngroups = (w.cols / 32 + 3) / 4;
  // Split K until ~2 CTAs per SM, keeping >= 4 groups (512 weights) per split so each CTA's fixed costs (the first
  // group's exposed loads, the epilogue's atomics) stay small against its streaming.
  int splits = 1;
  if (!swiglu) splits = std::clamp((2 * sm_count() + tiles - 1) / tiles, 1, std::max(1, ngroups / 4));
  const int per_split = (ngroups + splits - 1) / splits;
  splits = (ngroups + per_split - 1) / per_split;  // every split non-empty
  if (splits > 1 && epi == kEpiStore)
    LLMD_CUDA_CHECK(cudaMemset2DAsync(y, size_t(ldy) * sizeof(float), 0, size_t(w.rows) * sizeof(float), x.n, stream));
  const dim3 grid(tiles, splits), block(kMmaThreads);
  const WeightView v = view(w);
  if (x.n <= 16) mma_kernel<F, 16, MT><<<grid, block, 0, stream>>>(v, x, y, ldy, epi, per_split);
  else mma_kernel<F, 32, MT><<<grid, block, 0, stream>>>(v, x, y, ldy, epi, per_split);
  LLMD_CUDA_CHECK_LAUNCH();
}

// Store/Add: tiles of 128 rows (MT = 2: each activation fragment loaded from shared memory feeds two m16 tiles, half
// the shared-memory reads per weight; few tiles are made up for by splitting K). SwiGLU cannot split K (the epilogue
// is nonlinear), so it takes 64-row tiles (32 gate + 32 up), twice the CTAs: the 8B gate|up has 448 (224 with MT =
// 2, under 2 per SM on 132 SMs), with fewer registers each. Always, not by size, so the tests cover both forms.
template <class F>
void launch_mma(const DeviceMatrix& w, const ActView& x, float* y, int ldy, int epi, cudaStream_t stream) {
  if (epi == kEpiSwiGLU) launch_mma_tiles<F, 1>(w, x, y, ldy, epi, stream);
  else launch_mma_tiles<F, 2>(w, x, y, ldy, epi, stream);
}

// One thread per 32 weights of a row: MmaDec's float16 pairs in natural order (the test compares them with the
// prefill path's dequant32-based float16 matrix, so a decoder bug shows apart from the fragment and tiling logic).
template <class F>
__global__ void mma_decode_kernel(WeightView w, __half* out) {
  const int nb = w.cols / 32;
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= size_t(w.rows) * nb) return;
  const int row = int(t / nb), b = int(t % nb);
  __half2 o[16];
  MmaDec<F>::dec(w, row, b, o);
  __half2* dst = reinterpret_cast<__half2*>(out + size_t(row) * w.cols + size_t(b) * 32);
#pragma unroll
  for (int i = 0; i < 16; ++i) dst[i] = o[i];
}

}  // namespace

void mma_decode_f16(const DeviceMatrix& w, __half* out, cudaStream_t stream) {
  const size_t threads = size_t(w.rows) * (w.cols / 32);
  const WeightView v = view(w);
  dispatch_format(w.format, [&]<class F>() {
    mma_decode_kernel<F><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(v, out);
  });
  LLMD_CUDA_CHECK_LAUNCH();
}

void mma_matmul(const DeviceMatrix& w, const Activations& x, float* y, int ldy, Epilogue epilogue,
                cudaStream_t stream) {
  const int cols32 = round_up(x.cols, 32);
  auto* base = static_cast<uint8_t*>(x.q8());
  const ActView av{base, reinterpret_cast<const float2*>(base + q8_ds_offset(x.max_rows(), x.max_cols())), x.f32(),
                   cols32, cols32 / 32, x.cols, x.rows};
  const int epi = epilogue == Epilogue::Store ? kEpiStore : epilogue == Epilogue::Add ? kEpiAdd : kEpiSwiGLU;
  dispatch_format(w.format, [&]<class F>() {
    if constexpr (!std::is_same_v<F, FmtF16>) launch_mma<F>(w, av, y, ldy, epi, stream);
  });
}

}  // namespace llmd::cuda::detail
