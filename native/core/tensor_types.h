// Tensor element/block formats llmd loads, numbered as GGUF numbers them (ggml_type).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace llmd {

enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  BF16 = 30,
};

struct BlockLayout {
  int elements;  // elements per block
  int bytes;     // bytes per block
};

// Block size and byte size of a type; throws for types llmd cannot read.
BlockLayout block_layout(TensorType type);
std::string type_name(TensorType type);
bool is_quantized(TensorType type);
size_t row_bytes(TensorType type, int64_t n_elements);

}  // namespace llmd
