// IEEE half <-> float without hardware support (the scalar path and load-time conversions).
#pragma once

#include <cstdint>
#include <cstring>

namespace llmd {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest, ties to even, as F16C's vcvtps2ph and numpy's float16 cast do (the KV
// cache's scalar path must store the same halves as the SIMD ones): overflow gives infinity,
// tiny values become subnormal halves or zero, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN, infinity
  if (x >= 0x477ff000u) return sign | 0x7c00;  // rounds past 65504
  if (x < 0x38800000u) {                       // below 2^-14: a subnormal half (or zero)
    if (x < 0x33000000u) return sign;          // below half of the smallest subnormal
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(x >> 23);  // 14..24 bits dropped
    uint32_t h = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (h & 1))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = ((x >> 13) - ((127 - 15) << 10));
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: right
  return sign | static_cast<uint16_t>(h);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace llmd
