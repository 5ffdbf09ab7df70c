// Hadamard rotation of keys, values and queries around a quantized KV cache (--kv-type q8_0 /
// q4_0), as llama.cpp does by default since its PR 21038 (llama-kv-cache.cpp, attn_rot_k/v).
//
// Why: a few channels of a head's keys are much larger than the rest (outlier channels). A
// q8_0 / q4_0 block shares one scale over 32 numbers, so the outlier sets the scale and the
// small numbers beside it round to a few levels. An orthonormal Hadamard transform H mixes
// every channel of a block into every output, spreading an outlier's magnitude evenly, so the
// block's scale fits all its numbers. Because H is orthonormal and symmetric (H H = I),
// rotating both q and k leaves q.k unchanged, and storing H v makes attention return H o,
// which one more H turns back into o: in exact arithmetic the rotation changes nothing but
// what the quantizer sees.
//
// The matrix is the natural-order (Sylvester) Walsh-Hadamard matrix scaled by 1/sqrt(n),
// H[i][j] = (-1)^popcount(i & j) / sqrt(n) (llama.cpp's ggml_gen_hadamard), applied to each
// run of n consecutive numbers of a head. n is the largest power of two dividing head_dim for
// keys and queries (llama.cpp's k rotation) and at most 64 for values (llama.cpp found smaller
// rotations better for V). Quantized KV needs head_dim a multiple of 32, so n >= 32.
//
// f16 / f32 KV are never rotated: their blocks keep the numbers the model computed.
#pragma once

#include <cmath>

namespace llmd::hadamard {

// Size of the rotation over a head of `head_dim` numbers (a multiple of 32): keys (and the
// queries that meet them) and values.
inline int key_block(int head_dim) { return head_dim & -head_dim; }
inline int value_block(int head_dim) { return key_block(head_dim) < 64 ? key_block(head_dim) : 64; }

// x[0..n) <- H x in place (n a power of two): the fast Walsh-Hadamard transform, log2(n)
// butterfly passes, then the 1/sqrt(n) that makes it orthonormal.
inline void transform(float* x, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float s = 1.f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

// Each run of `block` numbers of x[0..head_dim) rotated in place (applying it twice gives x
// back, up to float rounding).
inline void rotate(float* x, int head_dim, int block) {
  for (int b = 0; b < head_dim; b += block) transform(x + b, block);
}

}  // namespace llmd::hadamard
