// Quantized KV (KvType::Q8_0, Q4_0): GGML's q8_0 / q4_0 blocks inside the pool's per-head
// parts, and the scalar write and read of one position.
//
// Why GGML's blocks: --kv-type q8_0 must cost what llama.cpp's -ctk/-ctv q8_0 costs and round
// the same way, so the two engines' quality can be compared on the same model. A block is 32
// numbers of one position along head_dim with one float16 scale d: q8_0 stores round(x / d) as
// int8 with d = max|x| / 127; q4_0 stores min(15, trunc(x / d + 8.5)) as 4 bits with d = -m / 8
// (m the value of largest magnitude, so it maps to exactly -8); a number reads back as q * d
// (q8_0) or (q - 8) * d (q4_0), which float32 holds exactly.
//
// Layout of one head's part of a block (T = KvPool::kBlockTokens positions, D = head_dim, a
// multiple of 32), planar so the attention kernel loads 8 positions (keys) or 8 dims (values)
// with one vector load: the numbers first, then the scales as float16 bits.
//   keys,   q8_0: int8  [D][T],                     scales [D/32][T]
//   keys,   q4_0: uint8 [D/2][T]: row b*16+i holds dims b*32+i (low nibble) and b*32+16+i
//                 (high nibble) of each position,     scales [D/32][T]
//   values, q8_0: int8  [T][D],                     scales [T][D/32]
//   values, q4_0: uint8 [T][D/2]: GGML's qs order within each block of 32 (byte i: dims i and
//                 16+i),                              scales [T][D/32]
// Each byte holds numbers of one position only, so rows written by different threads (the
// positions of a prefill chunk) never share a byte.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fp16.h"
#include "kv_cache.h"

namespace llmd::kv_quant {

constexpr int kBlock = 32;

// Bytes of a head's numbers plane (the scales follow it).
inline size_t plane_bytes(KvType t, int head_dim, int block_tokens) {
  return static_cast<size_t>(head_dim) * block_tokens / (t == KvType::Q4_0 ? 2 : 1);
}

// GGML's quantize_row_q8_0_ref for one block: returns the scale's float16 bits.
inline uint16_t quantize_q8_0(const float* x, int8_t* q) {
  float amax = 0.f;
  for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int i = 0; i < kBlock; ++i) q[i] = static_cast<int8_t>(std::round(x[i] * id));
  return float_to_half(d);
}

// GGML's quantize_row_q4_0_ref for one block: the 4-bit codes (0..15) of the 32 numbers in
// order; returns the scale's float16 bits.
inline uint16_t quantize_q4_0(const float* x, uint8_t* q) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < kBlock; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  const float d = max / -8.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int i = 0; i < kBlock; ++i) {
    const int v = static_cast<int8_t>(x[i] * id + 8.5f);
    q[i] = static_cast<uint8_t>(v < 15 ? v : 15);
  }
  return float_to_half(d);
}

// Stores key k[0..head_dim) of position `off` into a head's key part (layout above).
inline void write_key(KvType t, void* part, int off, const float* k, int head_dim, int block_tokens) {
  auto* base = static_cast<uint8_t*>(part);
  auto* scales = reinterpret_cast<uint16_t*>(base + plane_bytes(t, head_dim, block_tokens));
  for (int b = 0; b < head_dim / kBlock; ++b) {
    const float* x = k + b * kBlock;
    uint16_t* s = scales + static_cast<size_t>(b) * block_tokens + off;
    if (t == KvType::Q8_0) {
      int8_t q[kBlock];
      *s = quantize_q8_0(x, q);
      for (int i = 0; i < kBlock; ++i) {
        base[static_cast<size_t>(b * kBlock + i) * block_tokens + off] = static_cast<uint8_t>(q[i]);
      }
    } else {
      uint8_t q[kBlock];
      *s = quantize_q4_0(x, q);
      for (int i = 0; i < kBlock / 2; ++i) {
        base[static_cast<size_t>(b * kBlock / 2 + i) * block_tokens + off] =
            static_cast<uint8_t>(q[i] | (q[i + kBlock / 2] << 4));
      }
    }
  }
}

// Stores value v[0..head_dim) of position `off` into a head's value part (layout above).
inline void write_value(KvType t, void* part, int off, const float* v, int head_dim, int block_tokens) {
  auto* base = static_cast<uint8_t*>(part);
  auto* scales = reinterpret_cast<uint16_t*>(base + plane_bytes(t, head_dim, block_tokens)) +
                 static_cast<size_t>(off) * (head_dim / kBlock);
  for (int b = 0; b < head_dim / kBlock; ++b) {
    const float* x = v + b * kBlock;
    if (t == KvType::Q8_0) {
      scales[b] = quantize_q8_0(x, reinterpret_cast<int8_t*>(base + static_cast<size_t>(off) * head_dim + b * kBlock));
    } else {
      uint8_t q[kBlock];
      scales[b] = quantize_q4_0(x, q);
      uint8_t* qs = base + static_cast<size_t>(off) * (head_dim / 2) + b * kBlock / 2;
      for (int i = 0; i < kBlock / 2; ++i) qs[i] = static_cast<uint8_t>(q[i] | (q[i + kBlock / 2] << 4));
    }
  }
}

// The numbers a position's key and value read back as (scalar; tests and checks: attention
// dequantizes in its own tile buffers).
inline void read_position(KvType t, const void* key_part, const void* value_part, int off, int head_dim,
                          int block_tokens, float* k, float* v) {
  const auto* kb = static_cast<const uint8_t*>(key_part);
  const auto* vb = static_cast<const uint8_t*>(value_part);
  const auto* ks = reinterpret_cast<const uint16_t*>(kb + plane_bytes(t, head_dim, block_tokens));
  const auto* vs = reinterpret_cast<const uint16_t*>(vb + plane_bytes(t, head_dim, block_tokens)) +
                   static_cast<size_t>(off) * (head_dim / kBlock);
  for (int d = 0; d < head_dim; ++d) {
    const int b = d / kBlock, i = d % kBlock;
    const float kd = half_to_float(ks[static_cast<size_t>(b) * block_tokens + off]);
    const float vd = half_to_float(vs[b]);
    if (t == KvType::Q8_0) {
      k[d] = static_cast<float>(static_cast<int8_t>(kb[static_cast<size_t>(d) * block_tokens + off])) * kd;
      v[d] = static_cast<float>(static_cast<int8_t>(vb[static_cast<size_t>(off) * head_dim + d])) * vd;
    } else {
      const int row = b * kBlock / 2 + i % (kBlock / 2);
      const int shift = i < kBlock / 2 ? 0 : 4;
      const int kq = (kb[static_cast<size_t>(row) * block_tokens + off] >> shift) & 15;
      const int vq = (vb[static_cast<size_t>(off) * (head_dim / 2) + row] >> shift) & 15;
      k[d] = static_cast<float>(kq - 8) * kd;
      v[d] = static_cast<float>(vq - 8) * vd;
    }
  }
}

}  // namespace llmd::kv_quant
