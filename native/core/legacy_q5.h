// Q5_0 and Q5_1 (GGUF types 6 and 7): 32 weights per block, Q4_0's / Q4_1's nibbles plus a
// fifth bit per weight. Q5_0 (22 bytes): fp16 d, qh (uint32, little-endian), qs[16]; weight
// d * (q - 16). Q5_1 (24 bytes): fp16 d, fp16 m, qh, qs[16]; weight d * q + m. Code q of weight
// i is the low nibble of qs[i] (i < 16) or the high nibble of qs[i - 16], plus bit i of qh
// times 16. llama.cpp writes them into K-quant files as the fallback for rows whose width is no
// multiple of 256 (Q4_K -> Q5_0, Q5_K -> Q5_1: Qwen2.5-0.5B's 896, SmolLM2-360M's 960).
//
// The CPU kernels run them as Q4_0 / Q4_1 with the fifth bit added to each code (qgemm_impl.h,
// legacy_zmm_impl.h; the 8-row tiles in pack8.h); every other reader takes the codes from here.
#pragma once

#include <cstdint>
#include <cstring>

namespace llmd {

// Bytes of one block; where its qh and qs start.
constexpr int q5_block_bytes(bool has_min) { return has_min ? 24 : 22; }
constexpr int q5_qh_offset(bool has_min) { return has_min ? 4 : 2; }
constexpr int q5_qs_offset(bool has_min) { return has_min ? 8 : 6; }

// The 32 fifth bits of a block (bit i: weight i's).
inline uint32_t q5_fifth_bits(const uint8_t* blk, bool has_min) {
  uint32_t qh;
  std::memcpy(&qh, blk + q5_qh_offset(has_min), sizeof(qh));
  return qh;
}

// The 32 codes (0 .. 31) of one block in weight order.
template <class Out>
inline void q5_block_codes(const uint8_t* blk, bool has_min, Out* out) {
  const uint32_t qh = q5_fifth_bits(blk, has_min);
  const uint8_t* qs = blk + q5_qs_offset(has_min);
  for (int i = 0; i < 16; ++i) {
    out[i] = static_cast<Out>((qs[i] & 0x0f) | (((qh >> i) & 1) << 4));
    out[i + 16] = static_cast<Out>((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
  }
}

}  // namespace llmd
