// The 8-row packed layout of Q4_0 / Q4_1 / Q8_0 weights used by the x86 kernels.
//
// Why: with rows stored one after another, every 32-element block of every (activation row,
// weight row) pair needs its own int->float conversion, scale multiply and FMA, and the final
// horizontal sum: on AVX2 that float work costs as much as the integer dot itself. Packing 8
// consecutive weight rows so that one 256-bit register holds the same 4 elements of all 8
// rows makes each instruction produce 8 output columns at once: the integer products land in
// the lane of their column (no horizontal sums), and the block's 8 scales convert in one
// instruction. The byte count is unchanged (weights are packed in place at load time).
//
// Tile block b of a group of 8 rows (rows 8g .. 8g+7, column c = row - 8g):
//   d[8]  fp16 scales                                  (16 bytes)
//   m[8]  fp16 minimums                  Q4_1 only     (16 bytes)
//   Q4_0 / Q4_1: 4 chunks h = 0..3 of 32 bytes; chunk h holds, for c = 0..7, row c's quant
//     bytes 4h .. 4h+3 (low nibbles: elements 4h..4h+3, high: elements 16+4h..16+4h+3)
//   Q8_0: 8 chunks g = 0..7 of 32 bytes; chunk g holds row c's quants 4g .. 4g+3 at 4c.
// A group's bytes occupy exactly the bytes its 8 rows occupied, so the row-major offset of
// row 8g (8g * row_bytes) is also where its group starts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../core/tensor_types.h"

namespace llmd::kernels {

constexpr int kPackRows = 8;

// Whether `type` has a packed layout (Q4_0, Q4_1, Q8_0).
bool has_pack8_layout(TensorType type);

// Packs `n_rows` (a multiple of 8) rows of `k` elements, row-major at `rows`, in place.
void pack8_in_place(TensorType type, uint8_t* rows, int n_rows, int k);

// Row `row` of a packed matrix back in GGUF's own block layout (row_bytes(type, k) bytes).
void unpack8_row(TensorType type, const uint8_t* packed, int row, int k, uint8_t* out);

}  // namespace llmd::kernels
