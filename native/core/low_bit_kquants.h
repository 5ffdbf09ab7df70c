// Q2_K and Q3_K blocks (ggml-common.h), read in one place for the dequantizer and the portable
// kernels. 256 elements per super-block in 16 sub-blocks of 16:
//   Q2_K, 84 bytes: scales[16] (low nibble: sub-block scale, high nibble: its min), qs[64],
//     half d, half dmin. weight = d * sc * q - dmin * m, q in [0, 3].
//   Q3_K, 110 bytes: hmask[32], qs[64], 12 bytes of 6-bit scales, half d.
//     weight = d * (sc - 32) * (q - 4), q in [0, 7].
// Element 128n + 32j + l (n < 2, j < 4, l < 32) has its 2 low bits at bits 2j..2j+1 of
// qs[32n + l], and (Q3_K) its third bit at bit 4n + j of hmask[l]; it belongs to sub-block
// 8n + 2j + l / 16.
#pragma once

#include <cstdint>
#include <cstring>

namespace llmd {

constexpr int kQ2KBlockBytes = 84;
constexpr int kQ3KBlockBytes = 110;

// The 16 signed scales (sc - 32) of a Q3_K block from its 12 packed bytes: bytes 0-7 hold the
// low 4 bits (sub-block i in byte i's low nibble, sub-block 8 + i in its high nibble), bytes
// 8-11 the 2 high bits (sub-block 4s + i's at bits 2s..2s+1 of byte 8 + i).
inline void q3k_scales(const uint8_t* packed, int8_t out[16]) {
  uint32_t a[3];
  std::memcpy(a, packed, 12);
  constexpr uint32_t kLow = 0x0f0f0f0fu, kHigh = 0x03030303u;
  const uint32_t w[4] = {(a[0] & kLow) | (((a[2] >> 0) & kHigh) << 4),
                         (a[1] & kLow) | (((a[2] >> 2) & kHigh) << 4),
                         ((a[0] >> 4) & kLow) | (((a[2] >> 4) & kHigh) << 4),
                         ((a[1] >> 4) & kLow) | (((a[2] >> 6) & kHigh) << 4)};
  uint8_t u[16];
  std::memcpy(u, w, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>(u[i] - 32);
}

// A Q2_K (kThree = false) or Q3_K block's codes in element order: q in [0, 3] or [0, 7].
template <bool kThree>
inline void low_bit_codes(const uint8_t* blk, uint8_t q[256]) {
  const uint8_t* qs = blk + (kThree ? 32 : 16);
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        int v = (qs[32 * n + l] >> (2 * j)) & 3;
        if constexpr (kThree) v |= ((blk[l] >> (4 * n + j)) & 1) << 2;
        q[128 * n + 32 * j + l] = static_cast<uint8_t>(v);
      }
    }
  }
}

}  // namespace llmd
