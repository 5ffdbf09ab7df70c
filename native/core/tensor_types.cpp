#include "tensor_types.h"

#include <stdexcept>

namespace llmd {

BlockLayout block_layout(TensorType type) {
  switch (type) {
    case TensorType::F32: return {1, 4};
    case TensorType::F16: return {1, 2};
    case TensorType::BF16: return {1, 2};
    case TensorType::Q4_0: return {32, 18};
    case TensorType::Q4_1: return {32, 20};
    case TensorType::Q5_0: return {32, 22};
    case TensorType::Q5_1: return {32, 24};
    case TensorType::Q8_0: return {32, 34};
    case TensorType::Q8_1: return {32, 36};
    case TensorType::Q2_K: return {256, 84};
    case TensorType::Q3_K: return {256, 110};
    case TensorType::Q4_K: return {256, 144};
    case TensorType::Q5_K: return {256, 176};
    case TensorType::Q6_K: return {256, 210};
    case TensorType::Q8_K: return {256, 292};
    case TensorType::IQ4_NL: return {32, 18};
  }
  throw std::runtime_error("unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
}

std::string type_name(TensorType type) {
  switch (type) {
    case TensorType::F32: return "F32";
    case TensorType::F16: return "F16";
    case TensorType::BF16: return "BF16";
    case TensorType::Q4_0: return "Q4_0";
    case TensorType::Q4_1: return "Q4_1";
    case TensorType::Q5_0: return "Q5_0";
    case TensorType::Q5_1: return "Q5_1";
    case TensorType::Q8_0: return "Q8_0";
    case TensorType::Q8_1: return "Q8_1";
    case TensorType::Q2_K: return "Q2_K";
    case TensorType::Q3_K: return "Q3_K";
    case TensorType::Q4_K: return "Q4_K";
    case TensorType::Q5_K: return "Q5_K";
    case TensorType::Q6_K: return "Q6_K";
    case TensorType::Q8_K: return "Q8_K";
    case TensorType::IQ4_NL: return "IQ4_NL";
  }
  return "type" + std::to_string(static_cast<uint32_t>(type));
}

bool is_quantized(TensorType type) {
  return !(type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16);
}

size_t row_bytes(TensorType type, int64_t n_elements) {
  const BlockLayout layout = block_layout(type);
  if (n_elements % layout.elements != 0) {
    throw std::runtime_error("row of " + std::to_string(n_elements) + " elements is not a multiple of " +
                             type_name(type) + "'s block of " + std::to_string(layout.elements));
  }
  return static_cast<size_t>(n_elements / layout.elements) * layout.bytes;
}

}  // namespace llmd
