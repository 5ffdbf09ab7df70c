#include "dequantize.h"

#include <cstring>
#include <stdexcept>

#include "fp16.h"
#include "iq4_nl.h"
#include "legacy_q5.h"
#include "low_bit_kquants.h"

namespace llmd {

namespace {

// The 6-bit scale and min of sub-block j of a Q4_K super-block (llama.cpp's packing).
void q4k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

void q4k_block_affine(const uint8_t* blk, uint8_t* q, float* scales, float* mins) {
  const float d = half_to_float(read_u16(blk));
  const float dmin = half_to_float(read_u16(blk + 2));
  const uint8_t* sc = blk + 4;
  const uint8_t* qs = blk + 16;
  for (int pair = 0; pair < 4; ++pair) {
    for (int half = 0; half < 2; ++half) {
      const int j = pair * 2 + half;
      int s = 0, m = 0;
      q4k_scale_min(j, sc, s, m);
      scales[j] = d * s;
      mins[j] = dmin * m;
      for (int l = 0; l < 32; ++l) q[j * 32 + l] = half ? (qs[pair * 32 + l] >> 4) : (qs[pair * 32 + l] & 0x0f);
    }
  }
}

void q5k_block_affine(const uint8_t* blk, uint8_t* q, float* scales, float* mins) {
  const float d = half_to_float(read_u16(blk));
  const float dmin = half_to_float(read_u16(blk + 2));
  const uint8_t* sc = blk + 4;
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + 48;
  for (int j = 0; j < 8; ++j) {
    int s = 0, m = 0;
    q4k_scale_min(j, sc, s, m);
    scales[j] = d * s;
    mins[j] = dmin * m;
    const int pair = j / 2;
    for (int l = 0; l < 32; ++l) {
      const int lo = (j % 2) ? (qs[pair * 32 + l] >> 4) : (qs[pair * 32 + l] & 0x0f);
      q[j * 32 + l] = static_cast<uint8_t>(lo | (((qh[l] >> j) & 1) << 4));
    }
  }
}

void dequantize_row(TensorType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case TensorType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(read_u16(src + 2 * i));
      return;
    case TensorType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(read_u16(src + 2 * i));
      return;
    case TensorType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * 34;
        const float d = half_to_float(read_u16(blk));
        const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
        for (int i = 0; i < 32; ++i) dst[b * 32 + i] = d * q[i];
      }
      return;
    case TensorType::Q4_0:
    case TensorType::Q4_1: {
      const bool has_min = type == TensorType::Q4_1;
      const int bytes = has_min ? 20 : 18;
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * bytes;
        const float d = half_to_float(read_u16(blk));
        const float m = has_min ? half_to_float(read_u16(blk + 2)) : -8.f * d;
        const uint8_t* qs = blk + (has_min ? 4 : 2);
        for (int i = 0; i < 16; ++i) {
          dst[b * 32 + i] = d * (qs[i] & 0x0f) + m;
          dst[b * 32 + i + 16] = d * (qs[i] >> 4) + m;
        }
      }
      return;
    }
    case TensorType::Q5_0:
    case TensorType::Q5_1: {
      const bool has_min = type == TensorType::Q5_1;
      uint8_t q[32];
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * q5_block_bytes(has_min);
        const float d = half_to_float(read_u16(blk));
        const float m = has_min ? half_to_float(read_u16(blk + 2)) : 0.f;
        q5_block_codes(blk, has_min, q);
        for (int i = 0; i < 32; ++i) dst[b * 32 + i] = has_min ? d * q[i] + m : d * (q[i] - 16);
      }
      return;
    }
    case TensorType::IQ4_NL:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * kIq4nlBlockBytes;
        const float d = half_to_float(read_u16(blk));
        float* out = dst + b * 32;
        iq4nl_block_levels(blk, kIq4nlValues, out);
        for (int i = 0; i < 32; ++i) out[i] *= d;
      }
      return;
    case TensorType::Q4_K: {
      uint8_t q[256];
      float scales[8], mins[8];
      for (int64_t b = 0; b < n / 256; ++b) {
        q4k_block_affine(src + b * 144, q, scales, mins);
        for (int i = 0; i < 256; ++i) dst[b * 256 + i] = scales[i / 32] * q[i] - mins[i / 32];
      }
      return;
    }
    case TensorType::Q5_K: {
      uint8_t q[256];
      float scales[8], mins[8];
      for (int64_t b = 0; b < n / 256; ++b) {
        q5k_block_affine(src + b * 176, q, scales, mins);
        for (int i = 0; i < 256; ++i) dst[b * 256 + i] = scales[i / 32] * q[i] - mins[i / 32];
      }
      return;
    }
    case TensorType::Q2_K: {
      uint8_t q[256];
      for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t* blk = src + b * kQ2KBlockBytes;
        const float d = half_to_float(read_u16(blk + 80)), dmin = half_to_float(read_u16(blk + 82));
        low_bit_codes<false>(blk, q);
        for (int i = 0; i < 256; ++i) {
          const int sc = blk[i / 16];
          dst[b * 256 + i] = d * static_cast<float>(sc & 0x0f) * q[i] - dmin * static_cast<float>(sc >> 4);
        }
      }
      return;
    }
    case TensorType::Q3_K: {
      uint8_t q[256];
      int8_t sc[16];
      for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t* blk = src + b * kQ3KBlockBytes;
        const float d = half_to_float(read_u16(blk + 108));
        low_bit_codes<true>(blk, q);
        q3k_scales(blk + 96, sc);
        for (int i = 0; i < 256; ++i) dst[b * 256 + i] = d * static_cast<float>(sc[i / 16]) * (q[i] - 4);
      }
      return;
    }
    case TensorType::Q6_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t* ql = src + b * 210;
        const uint8_t* qh = ql + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(ql + 192);
        const float d = half_to_float(read_u16(ql + 208));
        float* y = dst + b * 256;
        for (int h = 0; h < 2; ++h, y += 128, ql += 64, qh += 32, sc += 8) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            y[l] = d * sc[is] * (((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
      }
      return;
    default:
      throw std::runtime_error("cannot dequantize " + type_name(type) + " yet");
  }
}

}  // namespace llmd
