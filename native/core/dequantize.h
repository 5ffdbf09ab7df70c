// Scalar dequantization of one row of a GGUF tensor, for load-time conversions and embedding
// lookups (never on the matmul hot path).
#pragma once

#include <cstdint>

#include "tensor_types.h"

namespace llmd {

void dequantize_row(TensorType type, const uint8_t* src, float* dst, int64_t n);

// One Q4_K super-block (256 weights) as 8 affine groups of 32: weight i is
// scales[i / 32] * q[i] - mins[i / 32], with q in 0..15. Exact, so a device backend can hold
// Q4_K in a 4-bit affine format without requantizing.
void q4k_block_affine(const uint8_t* blk, uint8_t* q, float* scales, float* mins);
// The same for Q5_K (q in 0..31, the fifth bit from qh), exact in 8-bit affine groups.
void q5k_block_affine(const uint8_t* blk, uint8_t* q, float* scales, float* mins);

}  // namespace llmd
