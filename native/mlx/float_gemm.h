// y = x @ W^T for float weights (F32, or F16 widened once at load) on llmd's own thread pool,
// as an MLX CPU primitive.
//
// Why: MLX's CPU matmul hands float products to the BLAS it was linked with, whose threads
// spin beside llmd's pool on the same cores (on 2 cores an encoder's F16 layers ran at ~60% of
// the FMA peak, and collapsed by 10-50x whenever anything else ran); llama.cpp runs its F16
// GEMMs on its own threads. The weight is packed once into panels of kPanel output columns
// ([n_panels][k][kPanel], zero-padded), so a 6-row x kPanel-column register tile reads the
// panel contiguously. Each output is one FMA chain over k in order, whatever the batch it is in
// (rows and columns never change its arithmetic).
//
// On AVX-512 machines a kernel of its own (kernels/float_gemm_avx512.cpp) runs it, and takes
// panels of float16 too: F16 weights kept as stored (half the memory and the bytes read, no
// float32 copy made at load), widened exactly in the register. The product can carry its
// row-wise epilogue (bias, GELU-tanh, residual: a SigLIP or BERT layer's work after each
// matmul) so the output is written once.
#pragma once

#include <optional>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

namespace llmd {

namespace mx = mlx::core;

constexpr int kFloatPanel = 16;

// float32 [n, k] -> the packed panels (float32, ceil(n / 16) * k * 16 values).
mx::array pack_float_panels(const mx::array& w);
// The same panels in float16, for a weight whose values are all float16 (an F16 GGUF tensor):
// exact. Only where float16_panels_supported().
mx::array pack_float16_panels(const mx::array& w);
bool float16_panels_supported();

// What is done to each output of the product before it is stored, in this order.
struct FloatGemmEpilogue {
  std::optional<mx::array> bias;      // [n] added
  bool gelu_tanh = false;             // then GELU (tanh form)
  std::optional<mx::array> residual;  // [rows, n] added last
};

// x: [rows, k] (float32, or cast); panels from pack_float_panels (float32) or
// pack_float16_panels (float16) of an [n, k] weight.
mx::array float_gemm(const mx::array& x, const mx::array& panels, int n, int k, const FloatGemmEpilogue& epilogue = {});

// The kernel itself (tests, benchmarks): out [rows, n] = x [rows, k] @ W^T from its panels.
void float_gemm_rows(const float* x, int rows, int k, const float* panels, int n, float* out);

}  // namespace llmd
