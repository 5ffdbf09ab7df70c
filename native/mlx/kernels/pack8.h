// The 8-row packed layout of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K weights used by the x86 kernels
// (IQ4_NL, whose blocks are Q4_0's bytes, is packed exactly as Q4_0).
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
//
// K-quants tile whole 256-element super-blocks (GGUF block layouts: see kquant_impl.h). The
// same idea, plus scales re-encoded so that 8 columns' scales of one 32-element block are 8
// adjacent bytes (one widening load in the kernel, no per-row bit juggling):
//   Q4_K, 1152 bytes:
//     [0, 16)      d[8] fp16                [16, 32) dmin[8] fp16
//     [32, 96)     byte 32 + 8j + c: low 4 bits of sc[j] | low 4 bits of m[j] << 4 (row c,
//                  sub-block j = 0..7)
//     [96, 128)    byte 96 + 8j + c, j = 0..3: bits 0-1 sc[j] >> 4, 2-3 m[j] >> 4,
//                  4-5 sc[j+4] >> 4, 6-7 m[j+4] >> 4
//     [128, 1152)  chunk p = 0..3 (GGUF's qs[32p .. 32p+31]: low nibbles sub-block 2p, high
//                  2p+1), slice h = 0..7: 32 bytes at 128 + 256p + 32h holding row c's
//                  qs[32p + 4h .. +3] at 4c
//   Q5_K, 1408 bytes: Q4_K's tile (the same fields; in the GGUF block qh[32] precedes qs), then
//     [1152, 1408) slice h = 0..7: 32 bytes at 1152 + 32h holding row c's qh[4h .. +3] at 4c:
//                  bits 2p and 2p + 1 are the fifth bits of the elements chunk p's slice h holds
//   Q6_K, 1680 bytes:
//     [0, 16)      d[8] fp16
//     [16, 144)    byte 16 + 16b + 2c (+1): scales[2b] (scales[2b+1]) of row c, b = 0..7: one
//                  sign-extending load gives each column's pair of 16-element scales
//     [144, 1168)  half h = 0..1, pair p = 0..1, slice i = 0..7: 32 bytes at
//                  144 + 512h + 256p + 32i holding row c's ql[64h + 32p + 4i .. +3] at 4c
//     [1168, 1680) half h, slice i: 32 bytes at 1168 + 256h + 32i holding row c's
//                  qh[32h + 4i .. +3] at 4c
// Q4_K, Q5_K and Q6_K have a second layout, PackLayout::kQword, that the AVX-512 path loads
// (the other types are the same in both). Its 512-bit kernel reads a 64-byte slice as 8 columns x
// (4 bytes of sub-block 2p, 4 bytes of sub-block 2p + 1), so that one vpdpbusd against an
// activation qword holding both blocks' 4 bytes sums each block in its own 32-bit lane; the
// nibbles are regrouped so that a byte's two nibbles belong to the same sub-block, and Q5_K's
// fifth bits become 64-bit masks that one masked byte add applies to a slice:
//   [0, 128)      the scale header as above
//   [128, 1152)   chunk p = 0..3, slice s = 0..3: 64 bytes at 128 + 256p + 64s; row c's bytes
//                 8c + 4e + j (e = 0, 1; j = 0..3) hold elements 8s + j (low nibble) and
//                 8s + 4 + j (high nibble) of sub-block 2p + e
//   Q5_K [1152, 1408) chunk p, slice s: 16 bytes at 1152 + 64p + 16s: two 64-bit masks, bit
//                 8c + 4e + j the fifth bit of the low (first mask) / high (second) nibble of
//                 that byte
//   Q6_K (kQword), 1680 bytes, the same pairing (byte 8c + 4e + j of slice s: elements 8s + j
//   and 8s + 4 + j of sub-block 2p + e in its low / high nibble):
//     [0, 16)      d[8] fp16
//     [16, 144)    pair p = 0..3, half hf = 0..1: 16 bytes at 16 + 32p + 16hf, byte 2c + e:
//                  scales[2 (2p + e) + hf] of row c (one sign-extension: lane 2c + e's scale)
//     [144, 1168)  pair p, slice s: 64 bytes at 144 + 256p + 64s: the low 4 bits of the quants
//     [1168, 1680) pair p, slices 2u and 2u + 1: 64 bytes at 1168 + 128p + 64u: the quants' 2
//                  high bits, bits 0-1 (2-3) for slice 2u's low (high) nibbles, bits 4-5 (6-7)
//                  for slice 2u + 1's
// Q5_0 / Q5_1 (176 / 192 bytes): Q4_0's / Q4_1's tile of the codes' low 4 bits, then 32 bytes of
//   fifth bits at 144 (Q5_1: 160): byte 4c + j, bit 2h the fifth bit of row c's element 4h + j,
//   bit 2h + 1 that of element 16 + 4h + j.
// Q4_0 (and IQ4_NL), Q4_1 and Q8_0 have a kQword tile too where k is a multiple of 64 (otherwise
// they keep the tile above on every path): a pair of blocks 2p, 2p + 1, for legacy_zmm_impl.h's
// kernels.
//   Q4_0, 288 bytes:
//     [0, 32)     fp16 d, halfword 2c + e: row c's block 2p + e
//     [32, 288)   slice s = 0..3: 64 bytes at 32 + 64s; row c's byte 8c + 4e + j holds elements
//                 8s + j (low nibble) and 8s + 4 + j (high nibble) of block 2p + e
//   Q4_1, 320 bytes: [0, 32) as Q4_0, [32, 64) fp16 m in the same order, then Q4_0's slices at
//                 64 + 64s
//   Q8_0, 544 bytes: [0, 32) as Q4_0, then slice s = 0..7: 64 bytes at 32 + 64s; row c's byte
//                 8c + 4e + j holds q[4s + j] + 128 (q ^ 0x80, unsigned) of block 2p + e
//   Q5_0 / Q5_1, 352 / 384 bytes: Q4_0's / Q4_1's pair tile of the codes' low 4 bits, then slice
//                 s's two uint64 masks at 288 + 16s (Q5_1: 320 + 16s), low then high nibbles: bit
//                 8c + 4e + j the fifth bit of the code in that nibble of byte 8c + 4e + j
// A group's bytes occupy exactly the bytes its 8 rows occupied, so the row-major offset of
// row 8g (8g * row_bytes) is also where its group starts. Matrices whose row count is not a
// multiple of 8 are not packed (they keep GGUF's layout and the row-major kernels).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../core/tensor_types.h"

namespace llmd::kernels {

constexpr int kPackRows = 8;

// Which arrangement of the tile a kernel path reads (see above; only the K-quants differ).
enum class PackLayout : uint8_t { kDword, kQword };

// Whether `type` has a packed layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K).
bool has_pack8_layout(TensorType type);

// Packs `n_rows` (a multiple of 8) rows of `k` elements, row-major at `rows`, in place.
void pack8_in_place(TensorType type, uint8_t* rows, int n_rows, int k, PackLayout layout);

// Row `row` of a packed matrix back in GGUF's own block layout (row_bytes(type, k) bytes).
void unpack8_row(TensorType type, const uint8_t* packed, int row, int k, uint8_t* out, PackLayout layout);

}  // namespace llmd::kernels
