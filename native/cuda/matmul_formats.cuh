// Device-side readers of every WeightFormat (layouts in matmul_internal.h), in two shapes:
//  - the GEMV "unit" interface: a lane loads one unit (16-64 bytes of one weight row) with 16-byte loads, prep()
//    decodes it once after every load of the chunk is in flight, and dot2() dots two rows' units (the warp's row
//    pair) with one activation row, loading that row's activations once for both;
//  - dequant32(): 32 consecutive weights of a row as floats (the prefill dequantization and gather_rows).
// Integer formats dot int8 codes against the q8 activations with __dp4a; `ds` = (d, d * sum of codes) applies a
// block's offset (Q4_0's -8, K-quant mins, MLX biases) once per block.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul_internal.h"

namespace llmd::cuda::detail {

// The activations a GEMV reads (see matmul_internal.h for the q8 layout).
struct ActView {
  const uint8_t* codes;  // int8 [n][cols32]
  const float2* ds;      // [n][nblk]
  const float* f32;      // [n][cols]
  int cols32;
  int nblk;
  int cols;
  int n;
};

// Weights are read once per launch: stream them (evict-first) so the activations, re-read by every warp, stay in L1.
__device__ __forceinline__ uint4 ld_w16(const uint8_t* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint2 ld_w8(const uint8_t* p) { return __ldcs(reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ float ld_half(const uint8_t* base, size_t i) {
  return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(base) + i)));
}
__device__ __forceinline__ float2 ld_half2(const uint8_t* base, size_t i) {
  const unsigned int v = __ldg(reinterpret_cast<const unsigned int*>(base) + i);
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xFFFF))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16))));
}
// Byte k (0-15) of a 16-byte vector; k must be a compile-time constant after unrolling (registers, not memory).
__device__ __forceinline__ uint32_t byte_of(const uint4& v, int k) {
  const uint32_t w = k < 4 ? v.x : k < 8 ? v.y : k < 12 ? v.z : v.w;
  return (w >> (8 * (k & 3))) & 0xFF;
}
__device__ __forceinline__ uint4 ld_a16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) { return __dp4a(int(a), int(b), c); }
__device__ __forceinline__ uint32_t word(const uint4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// Nibble-packed 32 weights (byte j: weight j low, weight j + 16 high) dotted with one block's 32 codes (a0: codes
// 0-15, a1: codes 16-31).
__device__ __forceinline__ int dot_nibbles(const uint4& q, const uint4& a0, const uint4& a1) {
  int s = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s = dp4a(word(q, k) & 0x0F0F0F0F, word(a0, k), s);
    s = dp4a((word(q, k) >> 4) & 0x0F0F0F0F, word(a1, k), s);
  }
  return s;
}
__device__ __forceinline__ int dot_bytes(const uint4& q0, const uint4& q1, const uint4& a0, const uint4& a1,
                                         uint32_t flip = 0) {
  int s = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s = dp4a(word(q0, k) ^ flip, word(a0, k), s);
    s = dp4a(word(q1, k) ^ flip, word(a1, k), s);
  }
  return s;
}
__device__ __forceinline__ const uint8_t* act_block(const ActView& x, int r, int blk) {
  return x.codes + size_t(r) * x.cols32 + size_t(blk) * 32;
}
__device__ __forceinline__ float2 act_ds(const ActView& x, int r, int blk) { return __ldg(x.ds + size_t(r) * x.nblk + blk); }

// K-quant 6-bit scale / min j (0-7) from the block's 16-byte header (d, dmin, scales[12]); llama.cpp's packing.
__device__ __forceinline__ uint32_t kbyte(const uint4& h, int k) {
  const uint32_t w = k < 4 ? h.y : k < 8 ? h.z : h.w;
  return (w >> (8 * (k & 3))) & 0xFF;
}
__device__ __forceinline__ void kscale_min(const uint4& h, int j, float& sc, float& m) {
  uint32_t s, mm;
  if (j < 4) {
    s = kbyte(h, j) & 63;
    mm = kbyte(h, j + 4) & 63;
  } else {
    s = (kbyte(h, j + 4) & 0x0F) | ((kbyte(h, j - 4) >> 6) << 4);
    mm = (kbyte(h, j + 4) >> 4) | ((kbyte(h, j) >> 6) << 4);
  }
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xFFFF)));
  const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
  sc = d * float(s);
  m = dmin * float(mm);
}

// ---------------------------------------------------------------------------------------------------------------
struct FmtQ4_0 {
  static constexpr int kU = 4;  // units per lane per chunk (per row): 4 x 16 bytes in flight per row
  struct Unit {
    uint4 q;
    float d;
  };
  __device__ static int units(int cols) { return cols / 32; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    const size_t i = size_t(row) * (w.cols / 32) + u;
    U.q = ld_w16(w.data + i * 16);
    U.d = ld_half(w.aux, i);
  }
  __device__ static void prep(Unit&, int) {}
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const uint8_t* c = act_block(x, r, u);
    const uint4 a0 = ld_a16(c), a1 = ld_a16(c + 16);
    const float2 ds = act_ds(x, r, u);
    ca += A.d * (ds.x * float(dot_nibbles(A.q, a0, a1)) - 8.0f * ds.y);
    cb += B.d * (ds.x * float(dot_nibbles(B.q, a0, a1)) - 8.0f * ds.y);
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const size_t i = size_t(row) * (w.cols / 32) + blk;
    const uint4 q = ld_w16(w.data + i * 16);
    const float d = ld_half(w.aux, i);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = d * float(int(byte_of(q, j) & 15) - 8);
      v[j + 16] = d * float(int(byte_of(q, j) >> 4) - 8);
    }
  }
};

struct FmtQ8_0 {
  static constexpr int kU = 4;
  struct Unit {
    uint4 q0, q1;
    float d;
  };
  __device__ static int units(int cols) { return cols / 32; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    const size_t i = size_t(row) * (w.cols / 32) + u;
    U.q0 = ld_w16(w.data + i * 32);
    U.q1 = ld_w16(w.data + i * 32 + 16);
    U.d = ld_half(w.aux, i);
  }
  __device__ static void prep(Unit&, int) {}
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const uint8_t* c = act_block(x, r, u);
    const uint4 a0 = ld_a16(c), a1 = ld_a16(c + 16);
    const float dx = act_ds(x, r, u).x;
    ca += A.d * dx * float(dot_bytes(A.q0, A.q1, a0, a1));
    cb += B.d * dx * float(dot_bytes(B.q0, B.q1, a0, a1));
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const size_t i = size_t(row) * (w.cols / 32) + blk;
    const uint4 q0 = ld_w16(w.data + i * 32), q1 = ld_w16(w.data + i * 32 + 16);
    const float d = ld_half(w.aux, i);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = d * float(static_cast<int8_t>(byte_of(q0, j)));
      v[j + 16] = d * float(static_cast<int8_t>(byte_of(q1, j)));
    }
  }
};

// Q4_K: unit u = chunk j = u % 4 (64 weights: sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles) of
// qs[32j, 32j + 32)) of super-block u / 4; its activations are q8 blocks 2u and 2u + 1.
struct FmtQ4_K {
  static constexpr int kU = 2;
  struct Unit {
    uint4 h, q0, q1;
    float sc0, sc1, m0, m1;
  };
  __device__ static int units(int cols) { return cols / 64; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    const uint8_t* blk = w.data + (size_t(row) * (w.cols / 256) + u / 4) * 144;
    U.h = ld_w16(blk);
    U.q0 = ld_w16(blk + 16 + 32 * (u & 3));
    U.q1 = ld_w16(blk + 32 + 32 * (u & 3));
  }
  __device__ static void prep(Unit& U, int u) {
    kscale_min(U.h, 2 * (u & 3), U.sc0, U.m0);
    kscale_min(U.h, 2 * (u & 3) + 1, U.sc1, U.m1);
  }
  __device__ static float dot1(const Unit& U, const uint4* a, const float4& ds) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 = dp4a(word(U.q0, k) & 0x0F0F0F0F, word(a[0], k), s0);
      s0 = dp4a(word(U.q1, k) & 0x0F0F0F0F, word(a[1], k), s0);
      s1 = dp4a((word(U.q0, k) >> 4) & 0x0F0F0F0F, word(a[2], k), s1);
      s1 = dp4a((word(U.q1, k) >> 4) & 0x0F0F0F0F, word(a[3], k), s1);
    }
    return U.sc0 * ds.x * float(s0) + U.sc1 * ds.z * float(s1) - U.m0 * ds.y - U.m1 * ds.w;
  }
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const uint8_t* c = act_block(x, r, 2 * u);
    const uint4 a[4] = {ld_a16(c), ld_a16(c + 16), ld_a16(c + 32), ld_a16(c + 48)};
    const float4 ds = __ldg(reinterpret_cast<const float4*>(x.ds + size_t(r) * x.nblk + 2 * u));
    ca += dot1(A, a, ds);
    cb += dot1(B, a, ds);
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const uint8_t* b = w.data + (size_t(row) * (w.cols / 256) + blk / 8) * 144;
    const uint4 h = ld_w16(b);
    const int j = blk % 8;
    float sc, m;
    kscale_min(h, j, sc, m);
    const uint4 q0 = ld_w16(b + 16 + 32 * (j / 2)), q1 = ld_w16(b + 32 + 32 * (j / 2));
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      v[l] = sc * float((byte_of(q0, l) >> shift) & 15) - m;
      v[l + 16] = sc * float((byte_of(q1, l) >> shift) & 15) - m;
    }
  }
};

// Q5_K: as Q4_K, the fifth bit of weight l of sub-block s is bit s of qh[l] (qh: 32 bytes after the header).
struct FmtQ5_K {
  static constexpr int kU = 2;
  struct Unit {
    uint4 h, qh0, qh1, q0, q1;
    uint32_t lo[8], hi[8];  // the 5-bit values of sub-blocks 2j and 2j + 1, four per word
    float sc0, sc1, m0, m1;
  };
  __device__ static int units(int cols) { return cols / 64; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    const uint8_t* blk = w.data + (size_t(row) * (w.cols / 256) + u / 4) * 176;
    U.h = ld_w16(blk);
    U.qh0 = ld_w16(blk + 16);
    U.qh1 = ld_w16(blk + 32);
    U.q0 = ld_w16(blk + 48 + 32 * (u & 3));
    U.q1 = ld_w16(blk + 64 + 32 * (u & 3));
  }
  __device__ static void prep(Unit& U, int u) {
    const int j = u & 3;
    kscale_min(U.h, 2 * j, U.sc0, U.m0);
    kscale_min(U.h, 2 * j + 1, U.sc1, U.m1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t q = k < 4 ? word(U.q0, k) : word(U.q1, k - 4);
      const uint32_t qh = k < 4 ? word(U.qh0, k) : word(U.qh1, k - 4);
      U.lo[k] = (q & 0x0F0F0F0F) | (((qh >> (2 * j)) & 0x01010101) << 4);
      U.hi[k] = ((q >> 4) & 0x0F0F0F0F) | (((qh >> (2 * j + 1)) & 0x01010101) << 4);
    }
  }
  __device__ static float dot1(const Unit& U, const uint4* a, const float4& ds) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 = dp4a(U.lo[k], word(a[0], k), s0);
      s0 = dp4a(U.lo[k + 4], word(a[1], k), s0);
      s1 = dp4a(U.hi[k], word(a[2], k), s1);
      s1 = dp4a(U.hi[k + 4], word(a[3], k), s1);
    }
    return U.sc0 * ds.x * float(s0) + U.sc1 * ds.z * float(s1) - U.m0 * ds.y - U.m1 * ds.w;
  }
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const uint8_t* c = act_block(x, r, 2 * u);
    const uint4 a[4] = {ld_a16(c), ld_a16(c + 16), ld_a16(c + 32), ld_a16(c + 48)};
    const float4 ds = __ldg(reinterpret_cast<const float4*>(x.ds + size_t(r) * x.nblk + 2 * u));
    ca += dot1(A, a, ds);
    cb += dot1(B, a, ds);
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const uint8_t* b = w.data + (size_t(row) * (w.cols / 256) + blk / 8) * 176;
    const uint4 h = ld_w16(b);
    const int j = blk % 8;
    float sc, m;
    kscale_min(h, j, sc, m);
    const uint4 h0 = ld_w16(b + 16), h1 = ld_w16(b + 32);
    const uint4 q0 = ld_w16(b + 48 + 32 * (j / 2)), q1 = ld_w16(b + 64 + 32 * (j / 2));
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      v[l] = sc * float(((byte_of(q0, l) >> shift) & 15) | (((byte_of(h0, l) >> j) & 1) << 4)) - m;
      v[l + 16] = sc * float(((byte_of(q1, l) >> shift) & 15) | (((byte_of(h1, l) >> j) & 1) << 4)) - m;
    }
  }
};

// Q6_K (re-laid: ql[128] qh[64] scales[16] per block, d apart). Unit u of super-block u / 4: half n = (u >> 1) & 1
// (128 weights), lanes hh = u & 1 of it: l in [16hh, 16hh + 16) of the four 32-weight groups g of that half,
// weight 128n + 32g + l with scale scales[8n + 2g + hh] (one scale per 16 weights); its codes are the 16 bytes at
// offset 16hh of q8 block 8 * (u / 4) + 4n + g = 2u - 2hh + g.
struct FmtQ6_K {
  static constexpr int kU = 2;
  struct Unit {
    uint4 A, B, H;
    uint2 sc;
    float d;
    uint32_t v[4][4];  // [group][word]: the signed 6-bit values (q - 32), four per word
    float s[4];        // d * scale of each group
  };
  __device__ static int units(int cols) { return cols / 64; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    const size_t bi = size_t(row) * (w.cols / 256) + u / 4;
    const uint8_t* blk = w.data + bi * 208;
    const int n = (u >> 1) & 1, hh = u & 1;
    U.A = ld_w16(blk + 64 * n + 16 * hh);
    U.B = ld_w16(blk + 64 * n + 32 + 16 * hh);
    U.H = ld_w16(blk + 128 + 32 * n + 16 * hh);
    U.sc = ld_w8(blk + 192 + 8 * n);
    U.d = ld_half(w.aux, bi);
  }
  __device__ static void prep(Unit& U, int u) {
    const int hh = u & 1;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int b = 2 * g + hh;  // 0-7
      const uint32_t wd = b < 4 ? U.sc.x : U.sc.y;
      U.s[g] = U.d * float(static_cast<int8_t>((wd >> (8 * (b & 3))) & 0xFF));
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t a = word(U.A, k), b = word(U.B, k), h = word(U.H, k);
      U.v[0][k] = __vsub4((a & 0x0F0F0F0F) | ((h & 0x03030303) << 4), 0x20202020);
      U.v[1][k] = __vsub4((b & 0x0F0F0F0F) | (((h >> 2) & 0x03030303) << 4), 0x20202020);
      U.v[2][k] = __vsub4(((a >> 4) & 0x0F0F0F0F) | (((h >> 4) & 0x03030303) << 4), 0x20202020);
      U.v[3][k] = __vsub4(((b >> 4) & 0x0F0F0F0F) | (((h >> 6) & 0x03030303) << 4), 0x20202020);
    }
  }
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const int hh = u & 1;
    const int b0 = 2 * u - 2 * hh;
    const uint8_t* c = act_block(x, r, b0) + 16 * hh;
    const float2* dsp = x.ds + size_t(r) * x.nblk + b0;
    const float4 ds01 = __ldg(reinterpret_cast<const float4*>(dsp));
    const float4 ds23 = __ldg(reinterpret_cast<const float4*>(dsp + 2));
    const float dx[4] = {ds01.x, ds01.z, ds23.x, ds23.z};
    float ra = 0.f, rb = 0.f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint4 a = ld_a16(c + 32 * g);
      int sa = 0, sb = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sa = dp4a(A.v[g][k], word(a, k), sa);
        sb = dp4a(B.v[g][k], word(a, k), sb);
      }
      ra += A.s[g] * dx[g] * float(sa);
      rb += B.s[g] * dx[g] * float(sb);
    }
    ca += ra;
    cb += rb;
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const size_t bi = size_t(row) * (w.cols / 256) + blk / 8;
    const uint8_t* b = w.data + bi * 208;
    const float d = ld_half(w.aux, bi);
    const int n = (blk % 8) / 4, g = blk % 4;
    const uint4 l0 = ld_w16(b + 64 * n + (g & 1) * 32), l1 = ld_w16(b + 64 * n + (g & 1) * 32 + 16);
    const uint4 h0 = ld_w16(b + 128 + 32 * n), h1 = ld_w16(b + 128 + 32 * n + 16);
    const uint2 scw = ld_w8(b + 192 + 8 * n);
    const int shift = (g >= 2) ? 4 : 0;
    auto scale = [&](int k) {  // scales[8n + k], k = 0-7
      return float(static_cast<int8_t>(((k < 4 ? scw.x : scw.y) >> (8 * (k & 3))) & 0xFF));
    };
    const float s0 = d * scale(2 * g), s1 = d * scale(2 * g + 1);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      v[l] = s0 * float(int(((byte_of(l0, l) >> shift) & 15) | (((byte_of(h0, l) >> (2 * g)) & 3) << 4)) - 32);
      v[l + 16] = s1 * float(int(((byte_of(l1, l) >> shift) & 15) | (((byte_of(h1, l) >> (2 * g)) & 3) << 4)) - 32);
    }
  }
};

// MLX affine 4-bit, re-laid into Q4_0's nibble order; weight = scale * q + bias per group of group_size.
struct FmtMlx4 {
  static constexpr int kU = 4;
  struct Unit {
    uint4 q;
    float2 sb;
  };
  __device__ static int units(int cols) { return cols / 32; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    U.q = ld_w16(w.data + (size_t(row) * (w.cols / 32) + u) * 16);
    U.sb = ld_half2(w.aux, size_t(row) * (w.cols / w.group_size) + (u * 32) / w.group_size);
  }
  __device__ static void prep(Unit&, int) {}
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const uint8_t* c = act_block(x, r, u);
    const uint4 a0 = ld_a16(c), a1 = ld_a16(c + 16);
    const float2 ds = act_ds(x, r, u);
    ca += A.sb.x * ds.x * float(dot_nibbles(A.q, a0, a1)) + A.sb.y * ds.y;
    cb += B.sb.x * ds.x * float(dot_nibbles(B.q, a0, a1)) + B.sb.y * ds.y;
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const uint4 q = ld_w16(w.data + (size_t(row) * (w.cols / 32) + blk) * 16);
    const float2 sb = ld_half2(w.aux, size_t(row) * (w.cols / w.group_size) + (blk * 32) / w.group_size);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = sb.x * float(byte_of(q, j) & 15) + sb.y;
      v[j + 16] = sb.x * float(byte_of(q, j) >> 4) + sb.y;
    }
  }
};

// MLX affine 8-bit: codes flipped to signed (q - 128: xor of each byte's top bit), the 128 * scale folded into the
// bias term.
struct FmtMlx8 {
  static constexpr int kU = 4;
  struct Unit {
    uint4 q0, q1;
    float2 sb;
  };
  __device__ static int units(int cols) { return cols / 32; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    const uint8_t* p = w.data + size_t(row) * w.cols + size_t(u) * 32;
    U.q0 = ld_w16(p);
    U.q1 = ld_w16(p + 16);
    U.sb = ld_half2(w.aux, size_t(row) * (w.cols / w.group_size) + (u * 32) / w.group_size);
  }
  __device__ static void prep(Unit&, int) {}
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const uint8_t* c = act_block(x, r, u);
    const uint4 a0 = ld_a16(c), a1 = ld_a16(c + 16);
    const float2 ds = act_ds(x, r, u);
    ca += A.sb.x * ds.x * float(dot_bytes(A.q0, A.q1, a0, a1, 0x80808080u)) + (A.sb.y + 128.0f * A.sb.x) * ds.y;
    cb += B.sb.x * ds.x * float(dot_bytes(B.q0, B.q1, a0, a1, 0x80808080u)) + (B.sb.y + 128.0f * B.sb.x) * ds.y;
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const uint8_t* p = w.data + size_t(row) * w.cols + size_t(blk) * 32;
    const uint4 q0 = ld_w16(p), q1 = ld_w16(p + 16);
    const float2 sb = ld_half2(w.aux, size_t(row) * (w.cols / w.group_size) + (blk * 32) / w.group_size);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = sb.x * float(byte_of(q0, j)) + sb.y;
      v[j + 16] = sb.x * float(byte_of(q1, j)) + sb.y;
    }
  }
};

// F16: float products against the float32 activations (no activation rounding). Unit = 8 weights.
struct FmtF16 {
  static constexpr int kU = 4;
  struct Unit {
    uint4 q;
  };
  __device__ static int units(int cols) { return cols / 8; }
  __device__ static void load(const WeightView& w, int row, int u, Unit& U) {
    U.q = ld_w16(w.data + (size_t(row) * w.cols + size_t(u) * 8) * 2);
  }
  __device__ static void prep(Unit&, int) {}
  __device__ static float dot1(const Unit& U, const float4& x0, const float4& x1) {
    const float2 w0 = __half22float2(*reinterpret_cast<const __half2*>(&U.q.x));
    const float2 w1 = __half22float2(*reinterpret_cast<const __half2*>(&U.q.y));
    const float2 w2 = __half22float2(*reinterpret_cast<const __half2*>(&U.q.z));
    const float2 w3 = __half22float2(*reinterpret_cast<const __half2*>(&U.q.w));
    return w0.x * x0.x + w0.y * x0.y + w1.x * x0.z + w1.y * x0.w + w2.x * x1.x + w2.y * x1.y + w3.x * x1.z +
           w3.y * x1.w;
  }
  __device__ static void dot2(const Unit& A, const Unit& B, const ActView& x, int r, int u, float& ca, float& cb) {
    const float4* p = reinterpret_cast<const float4*>(x.f32 + size_t(r) * x.cols + size_t(u) * 8);
    const float4 x0 = __ldg(p), x1 = __ldg(p + 1);
    ca += dot1(A, x0, x1);
    cb += dot1(B, x0, x1);
  }
  __device__ static void dequant32(const WeightView& w, int row, int blk, float* v) {
    const uint8_t* p = w.data + (size_t(row) * w.cols + size_t(blk) * 32) * 2;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 q = ld_w16(p + 16 * k);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[8 * k + 2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[j] & 0xFFFF)));
        v[8 * k + 2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[j] >> 16)));
      }
    }
  }
};

// Calls f.template operator()<Fmt>() for w's format (one switch for every launcher).
template <class F>
void dispatch_format(WeightFormat format, F&& f) {
  switch (format) {
    case WeightFormat::F16: f.template operator()<FmtF16>(); return;
    case WeightFormat::Q4_0: f.template operator()<FmtQ4_0>(); return;
    case WeightFormat::Q8_0: f.template operator()<FmtQ8_0>(); return;
    case WeightFormat::Q4_K: f.template operator()<FmtQ4_K>(); return;
    case WeightFormat::Q5_K: f.template operator()<FmtQ5_K>(); return;
    case WeightFormat::Q6_K: f.template operator()<FmtQ6_K>(); return;
    case WeightFormat::MlxAffine4: f.template operator()<FmtMlx4>(); return;
    case WeightFormat::MlxAffine8: f.template operator()<FmtMlx8>(); return;
  }
}

}  // namespace llmd::cuda::detail
