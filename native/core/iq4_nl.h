// IQ4_NL (GGUF type 20): 32 weights per block laid out as Q4_0's (fp16 d, then 16 bytes: weight
// i in the low nibble of byte i, weight i + 16 in the high one), but code n stands for
// d * kIq4nlValues[n], a non-uniform grid denser near zero, where Q4_0's stands for d * (n - 8).
// IQ4_XS files hold the same codes under per-32 6-bit scales; a pull re-encodes them as IQ4_NL
// (daemon/llmd/store/block_repack.py), so both run on the kernels of this one type.
//
// Every level is an int8, so a block is also exactly a Q8_0 block of the same d, and an 8-bit
// affine group (code + 128, scale d, bias -128 d): the CUDA upload and the MLX device weights
// take those forms.
#pragma once

#include <cstdint>

namespace llmd {

inline constexpr int kIq4nlBlockBytes = 18;

// The 16 levels, as llama.cpp's ggml-common.h defines them (gguf-py's dequantizer agrees:
// tests/native/test_kernels.py).
alignas(16) inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                        1,    13,   25,  38,  53,  69,  89,  113};

// The levels offset by 128 (as unsigned bytes, 1 .. 241): the unsigned operand of vpdpbusd, or an
// 8-bit affine code.
alignas(16) inline constexpr uint8_t kIq4nlValuesU8[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                                           129, 141, 153, 166, 181, 197, 217, 241};

// The 32 levels of one block in weight order, looked up in `levels` (kIq4nlValues or
// kIq4nlValuesU8) and converted to Out: the one reader of the nibble layout outside the SIMD
// kernels (dequantization, the scalar dot, the MLX and CUDA uploads).
template <class Level, class Out>
inline void iq4nl_block_levels(const uint8_t* blk, const Level (&levels)[16], Out* out) {
  for (int i = 0; i < 16; ++i) {
    out[i] = static_cast<Out>(levels[blk[2 + i] & 0x0f]);
    out[i + 16] = static_cast<Out>(levels[blk[2 + i] >> 4]);
  }
}

}  // namespace llmd
