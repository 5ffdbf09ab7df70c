// Shared by the matmul tests and benchmarks: random GGUF / MLX matrices (valid blocks: random quant bytes, finite
// float16 scales) with their float reference from core's dequantize_row of the very bytes uploaded.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dequantize.h"
#include "core/fp16.h"
#include "core/tensor_types.h"
#include "cuda/matmul.h"
#include "cuda_test.h"

namespace llmd::cuda::testing {

// A source matrix: GGUF bytes (type) or MLX affine (mlx_bits 4/8), and what the device should compute with.
struct HostMatrix {
  std::string name;
  TensorType type = TensorType::F16;
  int mlx_bits = 0;  // 0: GGUF
  int group_size = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> gguf;
  std::vector<uint32_t> mlx_w;
  std::vector<uint16_t> mlx_scales, mlx_biases;

  DeviceMatrix upload() const {
    if (mlx_bits != 0)
      return upload_mlx_affine(mlx_bits, group_size, mlx_w.data(), mlx_scales.data(), mlx_biases.data(), rows, cols);
    return upload_gguf_matrix(type, gguf.data(), rows, cols);
  }
  // Row r as floats, from the bytes the upload read.
  void dequant_row(int r, float* out) const {
    if (mlx_bits == 0) {
      dequantize_row(type, gguf.data() + r * row_bytes(type, cols), out, cols);
      return;
    }
    const size_t words = size_t(cols) * mlx_bits / 32, groups = cols / group_size;
    for (int c = 0; c < cols; ++c) {
      const int per = 32 / mlx_bits;
      const uint32_t q = (mlx_w[r * words + c / per] >> (mlx_bits * (c % per))) & ((1u << mlx_bits) - 1);
      const size_t g = r * groups + c / group_size;
      out[c] = half_to_float(mlx_scales[g]) * float(q) + half_to_float(mlx_biases[g]);
    }
  }
  std::vector<float> dequant() const {
    std::vector<float> w(size_t(rows) * cols);
    for (int r = 0; r < rows; ++r) dequant_row(r, &w[size_t(r) * cols]);
    return w;
  }
};

inline uint32_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return uint32_t(s >> 11);
}

// The float16 fields of each type's blocks (the scale d and, where there is one, the min), as byte offsets.
struct HalfFields {
  int block_bytes;
  int offsets[2];
  int n;
};
inline HalfFields half_fields(TensorType t) {
  switch (t) {
    case TensorType::Q4_0: return {18, {0, 0}, 1};
    case TensorType::Q4_1: return {20, {0, 2}, 2};
    case TensorType::Q8_0: return {34, {0, 0}, 1};
    case TensorType::IQ4_NL: return {18, {0, 0}, 1};
    case TensorType::Q4_K: return {144, {0, 2}, 2};
    case TensorType::Q5_K: return {176, {0, 2}, 2};
    case TensorType::Q6_K: return {210, {208, 0}, 1};
    case TensorType::Q5_0: return {22, {0, 0}, 1};
    case TensorType::Q5_1: return {24, {0, 2}, 2};
    case TensorType::Q2_K: return {84, {80, 82}, 2};
    case TensorType::Q3_K: return {110, {108, 0}, 1};
    default: return {0, {0, 0}, 0};
  }
}

// Random GGUF bytes of `type`: quant bytes uniform, float16 scales in [0.004, 0.02] (K-quant sub-scales multiply
// them by up to 63), F16/BF16/F32 values normal with standard deviation 0.05.
inline HostMatrix random_gguf(TensorType type, int rows, int cols, uint64_t seed) {
  HostMatrix m;
  m.name = type_name(type);
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  const size_t n = size_t(rows) * row_bytes(type, cols);
  m.gguf.resize(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 4 <= n; i += 4) {  // 4 bytes per step: the benchmarks fill hundreds of MB
    const uint32_t v = xorshift(s) ^ (xorshift(s) << 21);
    std::memcpy(&m.gguf[i], &v, 4);
  }
  for (size_t i = n / 4 * 4; i < n; ++i) m.gguf[i] = uint8_t(xorshift(s));
  auto uni = [&](float lo, float hi) { return lo + (hi - lo) * float(xorshift(s) & 0xFFFFFF) / float(0x1000000); };
  auto normal = [&]() {  // Irwin-Hall: cheap, bounded, near normal
    float a = 0;
    for (int k = 0; k < 4; ++k) a += uni(-1.f, 1.f);
    return a * 0.05f * 0.866f;
  };
  if (type == TensorType::F16 || type == TensorType::BF16) {
    for (size_t i = 0; i < n / 2; ++i) {
      const float v = normal();
      uint16_t h;
      if (type == TensorType::F16) {
        h = float_to_half(v);
      } else {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        h = uint16_t(b >> 16);
      }
      std::memcpy(&m.gguf[2 * i], &h, 2);
    }
  } else if (type == TensorType::F32) {
    for (size_t i = 0; i < n / 4; ++i) {
      const float v = normal();
      std::memcpy(&m.gguf[4 * i], &v, 4);
    }
  } else {
    const HalfFields f = half_fields(type);
    for (size_t b = 0; b < n / f.block_bytes; ++b)
      for (int k = 0; k < f.n; ++k) {
        const uint16_t h = float_to_half(uni(0.004f, 0.02f));
        std::memcpy(&m.gguf[b * f.block_bytes + f.offsets[k]], &h, 2);
      }
  }
  return m;
}

inline HostMatrix random_mlx(int bits, int group_size, int rows, int cols, uint64_t seed) {
  HostMatrix m;
  m.name = "mlx" + std::to_string(bits) + "_g" + std::to_string(group_size);
  m.mlx_bits = bits;
  m.group_size = group_size;
  m.rows = rows;
  m.cols = cols;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  m.mlx_w.resize(size_t(rows) * cols * bits / 32);
  for (auto& w : m.mlx_w) w = xorshift(s) ^ (xorshift(s) << 16);
  auto uni = [&](float lo, float hi) { return lo + (hi - lo) * float(xorshift(s) & 0xFFFFFF) / float(0x1000000); };
  const size_t ng = size_t(rows) * (cols / group_size);
  m.mlx_scales.resize(ng);
  m.mlx_biases.resize(ng);
  const float smax = bits == 4 ? 0.02f : 0.001f;
  for (size_t g = 0; g < ng; ++g) {
    m.mlx_scales[g] = float_to_half(uni(0.2f, 1.0f) * smax * ((xorshift(s) & 1) ? 1.f : -1.f));
    m.mlx_biases[g] = float_to_half(uni(-0.1f, 0.1f));
  }
  return m;
}

}  // namespace llmd::cuda::testing
