// llmd's CPU kernels for products of quantized GGUF weights with float activations.
//
// Why activations are quantized to int8 blocks: the weights are 4/8-bit integers in blocks of
// 32 with a float scale, so quantizing each 32-wide slice of the activation row the same way
// turns every block's dot product into one integer dot product (VNNI `vpdpbusd`, AVX2
// `pmaddubsw`, NEON `sdot`) plus one float multiply-add. Measured here, that is what reaches
// memory bandwidth on decode and keeps prefill compute-bound instead of conversion-bound.
//
// Isolation: each output element is computed by exactly the same sequence of operations
// whatever the number of activation rows in the call (rows are tiled, but every tile keeps an
// independent accumulator per (row, column) pair with the same block order), so a sequence's
// output never depends on what it was batched with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../core/tensor_types.h"
#include "pack8.h"

namespace llmd::kernels {

constexpr int kBlock = 32;

// One 32-wide slice of an activation row, quantized: x ~= d * q, and s = d * sum(q).
struct ActBlock {
  float d;
  float s;
  int8_t q[kBlock];
};

using QuantizeRowFn = void (*)(const float* x, ActBlock* out, int k);

// The K-quants (Q2_K ... Q6_K) take their activations per 256 (llama.cpp's Q8_K): the 8 blocks of a 256-wide
// super-block share one scale d (x ~= d * q, s = d * sum(q) per block as above). Why: with one
// activation scale per super-block, a kernel applies each sub-block's 6-bit weight scale to an
// integer dot product and takes the mins from the blocks' integer sums, in integers until one
// float multiply-add per super-block, instead of a conversion, a multiply and two FMAs per
// 32-element block (bench/README.md, issue 31: the AVX-512 Q5_K kernel 244-254 -> 275-302
// GMAC/s, AVX2 77-80 -> 87-89). The price is a coarser activation rounding where a block's
// values are much smaller than its super-block's largest, the trade llama.cpp makes for every
// K-quant. Q6_K too since its AVX2 prefill kernel sums a whole super-block in int32 (one float
// step per super-block instead of 8: 122 -> 143 GMAC/s on a Zen 5 core, issue 31); its other
// kernels read each block's scale, the same for the 8 blocks. Every path quantizes the same
// way, so SIMD and scalar paths see the same integers.
bool uses_superblock_activations(TensorType type);

// out[r * ldo + n] = dot(weight row n, activation row r) for r in [0, rows), n in [n0, n1).
// `w` points at weight row 0; rows are `w_row_bytes` apart. `a` holds rows * (k / 32) blocks.
using GemmFn = void (*)(const uint8_t* w, size_t w_row_bytes, const ActBlock* a, int k, int rows,
                        int n0, int n1, float* out, int ldo);

struct KernelTable {
  const char* isa;  // "avx512vnni", "avx2", "neondot", "neon", "scalar"
  QuantizeRowFn quantize_row;
  QuantizeRowFn quantize_row_k;  // per 256 (uses_superblock_activations); k a multiple of 256
  GemmFn q4_0;
  GemmFn q4_1;
  GemmFn q8_0;
  GemmFn q4_k;  // nullptr where not implemented: such weights are refused at load
  GemmFn q5_k;
  GemmFn q6_k;
  GemmFn iq4_nl = nullptr;
  GemmFn q2_k = nullptr;  // row-major only (kquant_low_bits.h)
  GemmFn q3_k = nullptr;
  GemmFn q5_0 = nullptr;  // Q4_0's / Q4_1's kernels with a fifth bit per code (core/legacy_q5.h)
  GemmFn q5_1 = nullptr;
  // Kernels for weights in the 8-row packed layout (pack8.h); null where this path has none,
  // and then weights stay row-major.
  GemmFn q4_0_x8 = nullptr;
  GemmFn q4_1_x8 = nullptr;
  GemmFn q8_0_x8 = nullptr;
  GemmFn q4_k_x8 = nullptr;
  GemmFn q5_k_x8 = nullptr;
  GemmFn q6_k_x8 = nullptr;
  GemmFn iq4_nl_x8 = nullptr;
  GemmFn q5_0_x8 = nullptr;
  GemmFn q5_1_x8 = nullptr;
  // How this path's packed kernels want the tile arranged (pack8.h): the engine packs with it.
  PackLayout pack_layout = PackLayout::kDword;
  // Output columns the engine hands a thread at a time come in multiples of this (a multiple of
  // 16: SwiGLU pairs and packed groups of 8 never straddle tasks). The AVX-512 prefill kernels
  // (kquant_zmm_blocked.h) work on 32-column blocks: a 16-column task runs their 1-vector tile
  // (4 int32 chains, too few to hide vpdpbusd's latency) over a half-empty expanded block.
  int column_quantum = 16;

  // The activation quantizer the kernels of `type` expect (quantize_row or quantize_row_k).
  QuantizeRowFn quantizer_for(TensorType type) const;
  GemmFn gemm_for(TensorType type) const;         // nullptr if this table has no kernel for it
  GemmFn packed_gemm_for(TensorType type) const;  // nullptr if it has no packed kernel
};

// Kernel tables compiled into this build, best first, that this CPU can run.
std::vector<const KernelTable*> runnable_tables();
// The table the engine uses: the best runnable one, or the one named by LLMD_CPU_PATH
// (an unknown or unrunnable name falls back to the best and is reported in the log).
const KernelTable& active_table();
const KernelTable* table_named(const std::string& isa);

// Per-ISA entry points (defined in qgemm_<isa>.cpp; null where not compiled in).
const KernelTable* scalar_table();
const KernelTable* avx2_table();
const KernelTable* avx512vnni_table();
const KernelTable* neondot_table();
const KernelTable* neon_table();

}  // namespace llmd::kernels
