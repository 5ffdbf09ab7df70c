// Scalar dequantization of one row of a GGUF tensor, for load-time conversions and embedding
// lookups (never on the matmul hot path).
#pragma once

#include <cstdint>

#include "tensor_types.h"

namespace llmd {

void dequantize_row(TensorType type, const uint8_t* src, float* dst, int64_t n);

}  // namespace llmd
