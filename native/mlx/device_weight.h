// Weights in MLX's own formats, for the backend that runs MLX's kernels on the GPU (CUDA,
// Metal) and, in tests, on MLX's CPU device.
//
// Why re-pack: llmd's CPU kernels read GGUF blocks directly, but on a GPU the well-tuned
// kernels MLX already ships (quantized_matmul with 32-weight affine groups) are the way onto
// the device. Block types whose maths is affine per 32 weights — Q4_0, Q4_1, Q8_0, Q4_K, and
// Q5_K, Q5_0, Q5_1 and IQ4_NL (whose 16 levels are int8s) in 8-bit groups — map exactly onto MLX's 4/8-bit affine layout (scale and bias rounded
// to float16). Other block types (Q6_K) are dequantized and re-quantized to 8-bit affine
// groups of 32, finer than any source format of 6 bits or fewer. Float tensors become float16.
#pragma once

#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "../core/gguf_file.h"
#include "../core/tensor_types.h"

namespace llmd {

namespace mx = mlx::core;

// The dtype the device backend computes products, attention and KV in: float16 on a GPU;
// float32 on MLX's CPU device, whose half-precision kernels are emulated and far slower.
mx::Dtype device_compute_dtype();

struct DeviceWeight {
  static constexpr int kGroup = 32;
  mx::array w{0.f};       // uint32 [n, k * bits / 32], or [n, k] compute dtype when dense
  mx::array scales{0.f};  // [n, k / 32] compute dtype
  mx::array biases{0.f};  // [n, k / 32] compute dtype
  int bits = 0;           // 4 or 8; 0: dense float16
  int group = kGroup;     // weights per scale/bias (32; 32, 64 or 128 from MLX checkpoints)
  bool requantized = false;

  // "affine4", "affine8", "affine8-requantized" or "f16".
  std::string format() const;
  // x [rows, k] (compute dtype) times the weight's transpose -> [rows, n] compute dtype.
  mx::array matmul(const mx::array& x) const;
};

// One row of a GGUF tensor (a weight matrix's output row).
struct RowRef {
  const TensorView* tensor;
  int64_t row;
};

// The rows, in order, all of `type` and `k` columns, as one device weight.
DeviceWeight device_weight_from_rows(const std::vector<RowRef>& rows, TensorType type, int k);
// MLX affine-quantized parts (mlx-lm checkpoints), rows stacked, kept as they are; scales and
// biases converted to the compute dtype.
DeviceWeight device_weight_from_mlx(const std::vector<mx::array>& w, const std::vector<mx::array>& scales,
                                    const std::vector<mx::array>& biases, int bits, int group);
// A float [n, k] weight (safetensors path).
DeviceWeight device_weight_from_float(const mx::array& w);

}  // namespace llmd
