// Host side of matmul.h: uploads (GGUF blocks re-laid for aligned loads, every bit kept; Q2_K / Q3_K re-quantized
// to Q8_0; other types dequantized to float16 once at load), and the names the engine reports. Layouts:
// matmul_internal.h.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../core/dequantize.h"
#include "../core/fp16.h"
#include "../core/iq4_nl.h"
#include "../core/kv_quant.h"
#include "../core/legacy_q5.h"
#include "matmul.h"
#include "matmul_internal.h"

namespace llmd::cuda {

namespace {

DeviceBuffer to_device(const std::vector<uint8_t>& host) {
  DeviceBuffer buf(host.size());
  if (!host.empty()) buf.upload(host.data(), host.size());
  return buf;
}

// Copies the bytes of the rows of every part into `out` through `per_row(src_row, row_index)`.
template <class F>
void for_each_row(const GgufPart* parts, int n_parts, size_t row_bytes, F&& per_row) {
  int row = 0;
  for (int p = 0; p < n_parts; ++p)
    for (int r = 0; r < parts[p].rows; ++r, ++row)
      per_row(static_cast<const uint8_t*>(parts[p].host) + size_t(r) * row_bytes, row);
}

// Blocks of 32 weights that are d * an int8 each, exactly: the device's Q8_0 blocks of the same fp16 d (a block's
// first two bytes), with the 32 int8s `int8s(block, out)` writes (IQ4_NL's levels, Q5_0's q - 16). No kernel of
// their own on the device: 8.5 bits per weight there.
template <class F>
void exact_q8_0(const GgufPart* parts, int n_parts, size_t rb, size_t block_bytes, detail::HostLayout& m, F&& int8s) {
  const size_t nb = m.cols / 32;
  m.format = WeightFormat::Q8_0;
  std::vector<uint8_t> data(size_t(m.rows) * nb * 32), aux(size_t(m.rows) * nb * 2);
  for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) {
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* blk = src + b * block_bytes;
      std::memcpy(&aux[(r * nb + b) * 2], blk, 2);
      int8s(blk, &data[(r * nb + b) * 32]);
    }
  });
  m.data = std::move(data);
  m.aux = std::move(aux);
}

}  // namespace

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F16: return "f16";
    case WeightFormat::Q4_0: return "q4_0";
    case WeightFormat::Q8_0: return "q8_0";
    case WeightFormat::Q4_K: return "q4_k";
    case WeightFormat::Q5_K: return "q5_k";
    case WeightFormat::Q6_K: return "q6_k";
    case WeightFormat::MlxAffine4: return "mlx_affine4";
    case WeightFormat::MlxAffine8: return "mlx_affine8";
  }
  return "?";
}

const char* matmul_path(const DeviceMatrix& w, int rows) {
  if (rows > gemv_row_limit()) return w.format == WeightFormat::F16 ? "gemm:cublas_f16" : "gemm:dequant_f16+cublas_f16";
  if (detail::use_mma(w, rows)) {
    switch (w.format) {
      case WeightFormat::Q4_0: return "mma:q4_0:f16";
      case WeightFormat::Q8_0: return "mma:q8_0:f16";
      case WeightFormat::Q4_K: return "mma:q4_k:f16";
      case WeightFormat::Q5_K: return "mma:q5_k:f16";
      case WeightFormat::Q6_K: return "mma:q6_k:f16";
      case WeightFormat::MlxAffine4: return "mma:mlx_affine4:f16";
      case WeightFormat::MlxAffine8: return "mma:mlx_affine8:f16";
      case WeightFormat::F16: break;
    }
  }
  switch (w.format) {
    case WeightFormat::F16: return "gemv:f16:fma";
    case WeightFormat::Q4_0: return "gemv:q4_0:dp4a";
    case WeightFormat::Q8_0: return "gemv:q8_0:dp4a";
    case WeightFormat::Q4_K: return "gemv:q4_k:dp4a";
    case WeightFormat::Q5_K: return "gemv:q5_k:dp4a";
    case WeightFormat::Q6_K: return "gemv:q6_k:dp4a";
    case WeightFormat::MlxAffine4: return "gemv:mlx_affine4:dp4a";
    case WeightFormat::MlxAffine8: return "gemv:mlx_affine8:dp4a";
  }
  return "?";
}

namespace detail {

HostLayout layout_gguf(TensorType type, const GgufPart* parts, int n_parts, int cols) {
  int rows = 0;
  for (int p = 0; p < n_parts; ++p) rows += parts[p].rows;
  // Every kernel reads whole blocks of 32 (activations too); model dimensions are multiples of 64 in practice.
  if (cols <= 0 || cols % 32 != 0)
    throw std::invalid_argument("upload_gguf: " + std::to_string(cols) + " columns is not a multiple of 32");
  const size_t rb = row_bytes(type, cols);
  HostLayout m;
  m.rows = rows;
  m.cols = cols;
  const size_t nb = cols / 32;  // blocks of 32 per row
  switch (type) {
    case TensorType::F16: {
      m.format = WeightFormat::F16;
      std::vector<uint8_t> data(size_t(rows) * rb);
      for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) { std::memcpy(&data[r * rb], src, rb); });
      m.data = std::move(data);
      return m;
    }
    case TensorType::Q4_0:
    case TensorType::Q8_0: {
      const bool q4 = type == TensorType::Q4_0;
      m.format = q4 ? WeightFormat::Q4_0 : WeightFormat::Q8_0;
      const size_t qb = q4 ? 16 : 32, blk = qb + 2;
      std::vector<uint8_t> data(size_t(rows) * nb * qb), aux(size_t(rows) * nb * 2);
      for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) {
        for (size_t b = 0; b < nb; ++b) {
          std::memcpy(&aux[(r * nb + b) * 2], src + b * blk, 2);
          std::memcpy(&data[(r * nb + b) * qb], src + b * blk + 2, qb);
        }
      });
      m.data = std::move(data);
      m.aux = std::move(aux);
      return m;
    }
    case TensorType::IQ4_NL:  // every level is an int8
      exact_q8_0(parts, n_parts, rb, kIq4nlBlockBytes, m,
                 [](const uint8_t* blk, uint8_t* q) { iq4nl_block_levels(blk, kIq4nlValues, q); });
      return m;
    case TensorType::Q5_0:  // d * (q - 16)
      exact_q8_0(parts, n_parts, rb, q5_block_bytes(false), m, [](const uint8_t* blk, uint8_t* q) {
        uint8_t codes[32];
        q5_block_codes(blk, false, codes);
        for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>(codes[i] - 16);
      });
      return m;
    case TensorType::Q5_1:
    case TensorType::Q2_K:
    case TensorType::Q3_K: {
      // No device kernel of their own: each 32 weights become a Q8_0 block (GGML's reference quantizer),
      // 8.5 bits per weight, as a pull converted these types before the CPU kernels had them
      // (float16 would take 6x the file's bytes on the device).
      m.format = WeightFormat::Q8_0;
      std::vector<uint8_t> data(size_t(rows) * nb * 32), aux(size_t(rows) * nb * 2);
      std::vector<float> x(cols);
      for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) {
        dequantize_row(type, src, x.data(), cols);
        for (size_t b = 0; b < nb; ++b) {
          const uint16_t dh = kv_quant::quantize_q8_0(&x[b * 32], reinterpret_cast<int8_t*>(&data[(r * nb + b) * 32]));
          std::memcpy(&aux[(r * nb + b) * 2], &dh, 2);
        }
      });
      m.data = std::move(data);
      m.aux = std::move(aux);
      return m;
    }
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K: {
      if (cols % 256 != 0)
        throw std::invalid_argument("upload_gguf: K-quant rows of " + std::to_string(cols) + " columns");
      const size_t nsb = cols / 256;
      if (type == TensorType::Q6_K) {
        m.format = WeightFormat::Q6_K;
        std::vector<uint8_t> data(size_t(rows) * nsb * 208), aux(size_t(rows) * nsb * 2);
        for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) {
          for (size_t b = 0; b < nsb; ++b) {
            std::memcpy(&data[(r * nsb + b) * 208], src + b * 210, 208);
            std::memcpy(&aux[(r * nsb + b) * 2], src + b * 210 + 208, 2);
          }
        });
        m.data = std::move(data);
        m.aux = std::move(aux);
        return m;
      }
      m.format = type == TensorType::Q4_K ? WeightFormat::Q4_K : WeightFormat::Q5_K;
      std::vector<uint8_t> data(size_t(rows) * rb);  // 144 / 176-byte blocks: already 16-byte aligned
      for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) { std::memcpy(&data[r * rb], src, rb); });
      m.data = std::move(data);
      return m;
    }
    default: {
      // No kernel of its own: float16 once at load (dequantize_row throws for a type it cannot read).
      m.format = WeightFormat::F16;
      std::vector<uint8_t> data(size_t(rows) * cols * 2);
      std::vector<float> tmp(cols);
      for_each_row(parts, n_parts, rb, [&](const uint8_t* src, int r) {
        dequantize_row(type, src, tmp.data(), cols);
        auto* dst = reinterpret_cast<uint16_t*>(&data[size_t(r) * cols * 2]);
        for (int c = 0; c < cols; ++c) dst[c] = float_to_half(tmp[c]);
      });
      m.data = std::move(data);
      return m;
    }
  }
}

}  // namespace detail

static DeviceMatrix to_device(detail::HostLayout&& h) {
  DeviceMatrix m;
  m.format = h.format;
  m.rows = h.rows;
  m.cols = h.cols;
  m.group_size = h.group_size;
  m.data = to_device(h.data);
  m.aux = to_device(h.aux);
  return m;
}

DeviceMatrix upload_gguf_stacked(TensorType type, const GgufPart* parts, int n_parts, int cols) {
  return to_device(detail::layout_gguf(type, parts, n_parts, cols));
}

DeviceMatrix upload_gguf_matrix(TensorType type, const void* host, int rows, int cols) {
  const GgufPart part{host, rows};
  return upload_gguf_stacked(type, &part, 1, cols);
}

namespace detail {

HostLayout layout_mlx_affine(int bits, int group_size, const uint32_t* w, const uint16_t* scales,
                             const uint16_t* biases, int rows, int cols) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("upload_mlx_affine: bits " + std::to_string(bits));
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("upload_mlx_affine: group size " + std::to_string(group_size));
  if (cols % group_size != 0)
    throw std::invalid_argument("upload_mlx_affine: " + std::to_string(cols) + " columns, group " +
                                std::to_string(group_size));
  HostLayout m;
  m.format = bits == 4 ? WeightFormat::MlxAffine4 : WeightFormat::MlxAffine8;
  m.rows = rows;
  m.cols = cols;
  m.group_size = group_size;
  const size_t words = size_t(cols) * bits / 32;  // per row
  std::vector<uint8_t> data(size_t(rows) * cols * bits / 8);
  if (bits == 8) {
    std::memcpy(data.data(), w, data.size());  // little-endian words: byte k of a row is weight k
  } else {
    // Weight e of a row is nibble e % 8 of word e / 8; re-laid per 32 weights as byte j = q[j] | q[j + 16] << 4.
    for (int r = 0; r < rows; ++r) {
      const uint32_t* wr = w + size_t(r) * words;
      uint8_t* dr = &data[size_t(r) * cols / 2];
      auto q = [&](int e) { return uint8_t((wr[e / 8] >> (4 * (e % 8))) & 15); };
      for (int b = 0; b < cols / 32; ++b)
        for (int j = 0; j < 16; ++j) dr[b * 16 + j] = uint8_t(q(b * 32 + j) | (q(b * 32 + j + 16) << 4));
    }
  }
  const size_t ng = size_t(rows) * (cols / group_size);
  std::vector<uint8_t> aux(ng * 4);
  for (size_t g = 0; g < ng; ++g) {
    std::memcpy(&aux[g * 4], &scales[g], 2);
    std::memcpy(&aux[g * 4 + 2], &biases[g], 2);
  }
  m.data = std::move(data);
  m.aux = std::move(aux);
  return m;
}

}  // namespace detail

DeviceMatrix upload_mlx_affine(int bits, int group_size, const uint32_t* w, const uint16_t* scales,
                               const uint16_t* biases, int rows, int cols) {
  return to_device(detail::layout_mlx_affine(bits, group_size, w, scales, biases, rows, cols));
}

}  // namespace llmd::cuda
