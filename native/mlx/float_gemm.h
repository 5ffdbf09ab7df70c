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
#pragma once

#include <mlx/mlx.h>
#include <mlx/primitives.h>

namespace llmd {

namespace mx = mlx::core;

constexpr int kFloatPanel = 16;

// float32 [n, k] -> the packed panels (float32, ceil(n / 16) * k * 16 values).
mx::array pack_float_panels(const mx::array& w);

// x: [rows, k] (float32, or cast); panels from pack_float_panels of an [n, k] weight.
mx::array float_gemm(const mx::array& x, const mx::array& panels, int n, int k);

// The kernel itself (tests, benchmarks): out [rows, n] = x [rows, k] @ W^T from its panels.
void float_gemm_rows(const float* x, int rows, int k, const float* panels, int n, float* out);

}  // namespace llmd
