#include "pack8.h"

#include <cstring>
#include <stdexcept>
#include <vector>

namespace llmd::kernels {

namespace {

struct BlockShape {
  int bytes;       // bytes of one GGUF block of 32 elements
  int scale_bytes; // fp16 scale (+ fp16 minimum) at the start of a block
  int chunks;      // 32-byte chunks of quants in a tile block (4-byte slices per row)
};

BlockShape shape_of(TensorType type) {
  switch (type) {
    case TensorType::Q4_0: return {18, 2, 4};
    case TensorType::Q4_1: return {20, 4, 4};
    case TensorType::Q8_0: return {34, 2, 8};
    default: throw std::invalid_argument("no packed layout for " + type_name(type));
  }
}

// Byte offset inside a tile block of row c's scale field f (0: d, 1: m), and of its quant
// slice s (4 bytes each).
int scale_offset(int field, int c) { return field * 16 + 2 * c; }
int quant_offset(const BlockShape& s, int slice, int c) { return s.scale_bytes * 8 + 32 * slice + 4 * c; }

// Calls fn(tile offset, block offset, bytes) for each piece of row c's block in a tile block.
template <class Fn>
void for_each_piece(const BlockShape& s, int c, Fn fn) {
  for (int f = 0; f < s.scale_bytes / 2; ++f) fn(scale_offset(f, c), 2 * f, 2);
  for (int slice = 0; slice < s.chunks; ++slice) fn(quant_offset(s, slice, c), s.scale_bytes + 4 * slice, 4);
}

}  // namespace

bool has_pack8_layout(TensorType type) {
  return type == TensorType::Q4_0 || type == TensorType::Q4_1 || type == TensorType::Q8_0;
}

void pack8_in_place(TensorType type, uint8_t* rows, int n_rows, int k) {
  if (n_rows % kPackRows != 0) throw std::invalid_argument("pack8: rows must be a multiple of 8");
  const BlockShape s = shape_of(type);
  const size_t rb = row_bytes(type, k);
  const int nb = k / 32;
  std::vector<uint8_t> group(rb * kPackRows);
  for (int g = 0; g < n_rows / kPackRows; ++g) {
    uint8_t* dst = rows + static_cast<size_t>(g) * kPackRows * rb;
    std::memcpy(group.data(), dst, group.size());
    for (int b = 0; b < nb; ++b) {
      uint8_t* tile = dst + static_cast<size_t>(b) * kPackRows * s.bytes;
      for (int c = 0; c < kPackRows; ++c) {
        const uint8_t* block = group.data() + c * rb + b * s.bytes;
        for_each_piece(s, c, [&](int t, int o, int n) { std::memcpy(tile + t, block + o, n); });
      }
    }
  }
}

void unpack8_row(TensorType type, const uint8_t* packed, int row, int k, uint8_t* out) {
  const BlockShape s = shape_of(type);
  const size_t rb = row_bytes(type, k);
  const uint8_t* group = packed + static_cast<size_t>(row / kPackRows) * kPackRows * rb;
  for (int b = 0; b < k / 32; ++b) {
    const uint8_t* tile = group + static_cast<size_t>(b) * kPackRows * s.bytes;
    uint8_t* block = out + b * s.bytes;
    for_each_piece(s, row % kPackRows, [&](int t, int o, int n) { std::memcpy(block + o, tile + t, n); });
  }
}

}  // namespace llmd::kernels
