#include "dequantize.h"

#include <cstring>
#include <stdexcept>

#include "fp16.h"

namespace llmd {

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
    default:
      throw std::runtime_error("cannot dequantize " + type_name(type) + " yet");
  }
}

}  // namespace llmd
