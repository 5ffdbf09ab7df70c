#include "device_weight.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "../core/dequantize.h"
#include "../core/fp16.h"
#include "../core/iq4_nl.h"
#include "../core/legacy_q5.h"

namespace llmd {

namespace {

constexpr int G = DeviceWeight::kGroup;

// Host-side buffers of a weight being converted, one output row at a time.
struct AffineBuilder {
  int bits;
  int k;
  std::vector<uint8_t> packed;
  std::vector<float> scales;
  std::vector<float> biases;

  AffineBuilder(int bits_, int k_, size_t n) : bits(bits_), k(k_) {
    packed.reserve(n * k * bits / 8);
    scales.reserve(n * k / G);
    biases.reserve(n * k / G);
  }
  // One group of 32 quantized values (0..2^bits-1) with w = scale * q + bias.
  void group(const uint8_t* q, float scale, float bias) {
    if (bits == 4) {
      for (int i = 0; i < G; i += 2) packed.push_back(static_cast<uint8_t>(q[i] | (q[i + 1] << 4)));
    } else {
      packed.insert(packed.end(), q, q + G);
    }
    scales.push_back(scale);
    biases.push_back(bias);
  }
  DeviceWeight finish(size_t n, bool requantized) {
    const auto cpu = mx::default_stream(mx::Device::cpu);
    const int ni = static_cast<int>(n);
    DeviceWeight d;
    d.bits = bits;
    d.requantized = requantized;
    mx::array bytes(packed.begin(), {ni, k * bits / 8}, mx::uint8);
    d.w = mx::view(bytes, mx::uint32, cpu);
    d.scales = mx::astype(mx::array(scales.begin(), {ni, k / G}, mx::float32), device_compute_dtype(), cpu);
    d.biases = mx::astype(mx::array(biases.begin(), {ni, k / G}, mx::float32), device_compute_dtype(), cpu);
    mx::eval({d.w, d.scales, d.biases});
    return d;
  }
};

// Exact 4/8-bit affine groups of one row of a block type whose maths is affine per 32.
void exact_row(TensorType type, const uint8_t* src, int k, AffineBuilder& out) {
  uint8_t q[256];
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q4_1: {
      const bool has_min = type == TensorType::Q4_1;
      const int bytes = has_min ? 20 : 18;
      for (int b = 0; b < k / 32; ++b) {
        const uint8_t* blk = src + static_cast<size_t>(b) * bytes;
        const float d = half_to_float(read_u16(blk));
        const float m = has_min ? half_to_float(read_u16(blk + 2)) : -8.f * d;
        const uint8_t* qs = blk + (has_min ? 4 : 2);
        for (int i = 0; i < 16; ++i) {
          q[i] = qs[i] & 0x0f;
          q[i + 16] = qs[i] >> 4;
        }
        out.group(q, d, m);
      }
      return;
    }
    case TensorType::Q8_0:
      for (int b = 0; b < k / 32; ++b) {
        const uint8_t* blk = src + static_cast<size_t>(b) * 34;
        const float d = half_to_float(read_u16(blk));
        for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>(static_cast<int8_t>(blk[2 + i]) + 128);
        out.group(q, d, -128.f * d);
      }
      return;
    case TensorType::Q5_0:
    case TensorType::Q5_1: {
      // 5-bit codes in 8-bit groups (as Q5_K's): scale d, bias m (Q5_0: -16 d).
      const bool has_min = type == TensorType::Q5_1;
      for (int b = 0; b < k / 32; ++b) {
        const uint8_t* blk = src + static_cast<size_t>(b) * q5_block_bytes(has_min);
        const float d = half_to_float(read_u16(blk));
        q5_block_codes(blk, has_min, q);
        out.group(q, d, has_min ? half_to_float(read_u16(blk + 2)) : -16.f * d);
      }
      return;
    }
    case TensorType::IQ4_NL:
      // Every level is an int8: 8-bit codes level + 128 under scale d and bias -128 d, as Q8_0's.
      for (int b = 0; b < k / 32; ++b) {
        const uint8_t* blk = src + static_cast<size_t>(b) * kIq4nlBlockBytes;
        const float d = half_to_float(read_u16(blk));
        iq4nl_block_levels(blk, kIq4nlValuesU8, q);
        out.group(q, d, -128.f * d);
      }
      return;
    case TensorType::Q4_K:
    case TensorType::Q5_K: {
      const bool five = type == TensorType::Q5_K;
      float scales[8], mins[8];
      for (int b = 0; b < k / 256; ++b) {
        const uint8_t* blk = src + static_cast<size_t>(b) * (five ? 176 : 144);
        if (five) {
          q5k_block_affine(blk, q, scales, mins);
        } else {
          q4k_block_affine(blk, q, scales, mins);
        }
        for (int j = 0; j < 8; ++j) out.group(q + j * 32, scales[j], -mins[j]);
      }
      return;
    }
    default:
      throw std::logic_error("not an affine block type");
  }
}

// 8-bit affine groups (min/max) of a row of floats.
void requantize_row(const float* x, int k, AffineBuilder& out) {
  uint8_t q[G];
  for (int g = 0; g < k / G; ++g) {
    const float* v = x + g * G;
    const auto [lo, hi] = std::minmax_element(v, v + G);
    const float scale = (*hi - *lo) > 0.f ? (*hi - *lo) / 255.f : 1.f;
    for (int i = 0; i < G; ++i) {
      q[i] = static_cast<uint8_t>(std::clamp(std::lround((v[i] - *lo) / scale), 0L, 255L));
    }
    out.group(q, scale, *lo);
  }
}

}  // namespace

mx::Dtype device_compute_dtype() {
  return mx::default_device() == mx::Device::gpu ? mx::float16 : mx::float32;
}

std::string DeviceWeight::format() const {
  if (bits == 0) return "f16";
  return "affine" + std::to_string(bits) + (requantized ? "-requantized" : "");
}

mx::array DeviceWeight::matmul(const mx::array& x) const {
  if (bits == 0) return mx::matmul(x, mx::transpose(w));
  return mx::quantized_matmul(x, w, scales, biases, /*transpose=*/true, group, bits, "affine");
}

DeviceWeight device_weight_from_rows(const std::vector<RowRef>& rows, TensorType type, int k) {
  const size_t n = rows.size();
  const size_t rb = row_bytes(type, k);
  const bool exact = type == TensorType::Q4_0 || type == TensorType::Q4_1 || type == TensorType::Q8_0 ||
                     type == TensorType::IQ4_NL || type == TensorType::Q4_K || type == TensorType::Q5_K ||
                     type == TensorType::Q5_0 || type == TensorType::Q5_1;
  if (exact) {
    // Q5_K's, Q5_0's and Q5_1's 5-bit codes sit in 8-bit groups (MLX's 5-bit layout packs across
    // bytes), as do IQ4_NL's levels (no 4-bit affine group holds them).
    const bool eight = type != TensorType::Q4_0 && type != TensorType::Q4_1 && type != TensorType::Q4_K;
    AffineBuilder b(eight ? 8 : 4, k, n);
    for (const RowRef& r : rows) exact_row(type, r.tensor->data + r.row * rb, k, b);
    return b.finish(n, false);
  }
  std::vector<float> row(k);
  if (is_quantized(type)) {
    if (k % G != 0) throw std::runtime_error("cannot re-quantize a row of " + std::to_string(k) + " weights");
    AffineBuilder b(8, k, n);
    for (const RowRef& r : rows) {
      dequantize_row(type, r.tensor->data + r.row * rb, row.data(), k);
      requantize_row(row.data(), k, b);
    }
    return b.finish(n, true);
  }
  std::vector<float> all(n * k);
  for (size_t i = 0; i < n; ++i) dequantize_row(type, rows[i].tensor->data + rows[i].row * rb, all.data() + i * k, k);
  return device_weight_from_float(mx::array(all.begin(), {static_cast<int>(n), k}, mx::float32));
}

DeviceWeight device_weight_from_mlx(const std::vector<mx::array>& w, const std::vector<mx::array>& scales,
                                    const std::vector<mx::array>& biases, int bits, int group) {
  const auto cpu = mx::default_stream(mx::Device::cpu);
  DeviceWeight d;
  d.bits = bits;
  d.group = group;
  d.w = w.size() == 1 ? w[0] : mx::concatenate(w, 0, cpu);
  d.scales = mx::astype(scales.size() == 1 ? scales[0] : mx::concatenate(scales, 0, cpu), device_compute_dtype(), cpu);
  d.biases = mx::astype(biases.size() == 1 ? biases[0] : mx::concatenate(biases, 0, cpu), device_compute_dtype(), cpu);
  d.w = mx::contiguous(d.w, false, cpu);
  mx::eval({d.w, d.scales, d.biases});
  return d;
}

DeviceWeight device_weight_from_float(const mx::array& w) {
  DeviceWeight d;
  d.w = mx::astype(w, device_compute_dtype(), mx::default_stream(mx::Device::cpu));
  d.w.eval();
  return d;
}

}  // namespace llmd
