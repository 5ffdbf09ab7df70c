// MLX custom primitive: y = x @ W^T with W kept in its GGUF quantized blocks, with the
// neighbouring per-row work fused in so a decode step is a handful of ops per layer:
//   - an RMS norm of x (weight, eps) applied while the rows are quantized to int8,
//   - an epilogue: add a residual, or SwiGLU over interleaved gate/up output pairs.
// Runs inside the engine's MLX graph on the CPU stream (eval_cpu on MLX's command encoder).
#pragma once

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "../core/tensor_types.h"
#include "kernels/qgemm.h"

namespace llmd {

namespace mx = mlx::core;

enum class Epilogue { None, AddResidual, SwiGLU };

struct QuantizedMatmulSpec {
  TensorType type = TensorType::Q4_0;
  int n = 0;  // weight rows (output features before SwiGLU halves them)
  int k = 0;
  bool packed = false;  // weight in the 8-row packed layout (kernels/pack8.h)
  bool rms_norm = false;  // inputs carry a norm weight [k]
  float eps = 1e-5f;
  Epilogue epilogue = Epilogue::None;

  int out_features() const { return epilogue == Epilogue::SwiGLU ? n / 2 : n; }
  bool operator==(const QuantizedMatmulSpec&) const = default;
};

class QuantizedMatmul : public mx::UnaryPrimitive {
 public:
  QuantizedMatmul(mx::Stream stream, QuantizedMatmulSpec spec, const kernels::KernelTable& table)
      : mx::UnaryPrimitive(stream), spec_(spec), table_(table) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "LlmdQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  QuantizedMatmulSpec spec_;
  const kernels::KernelTable& table_;
};

// x: [rows, k] float32; w: uint8 [n, row_bytes]. `norm_weight` ([k]) when spec.rms_norm;
// `residual` ([rows, n]) when spec.epilogue == AddResidual. SwiGLU expects weight rows
// interleaved as gate_0, up_0, gate_1, up_1, ...
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const QuantizedMatmulSpec& spec,
                           const std::optional<mx::array>& norm_weight = std::nullopt,
                           const std::optional<mx::array>& residual = std::nullopt,
                           const kernels::KernelTable& table = kernels::active_table());

}  // namespace llmd
