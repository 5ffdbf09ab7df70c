// MLX custom primitive: y = x @ W^T with W kept in its GGUF quantized blocks.
// Runs inside the engine's MLX graph on the CPU stream (eval_cpu on MLX's command encoder),
// so it composes with MLX's own ops and is evaluated with the rest of the step in one graph.
#pragma once

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "../core/tensor_types.h"
#include "kernels/qgemm.h"

namespace llmd {

namespace mx = mlx::core;

class QuantizedMatmul : public mx::UnaryPrimitive {
 public:
  QuantizedMatmul(mx::Stream stream, TensorType type, int n, int k, const kernels::KernelTable& table)
      : mx::UnaryPrimitive(stream), type_(type), n_(n), k_(k), table_(table) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override { return "LlmdQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  TensorType type_;
  int n_;
  int k_;
  const kernels::KernelTable& table_;
};

// x: [..., k] float32; w: uint8 [n, row_bytes] holding n rows of `type` blocks.
mx::array quantized_matmul(const mx::array& x, const mx::array& w, TensorType type, int n, int k,
                           const kernels::KernelTable& table = kernels::active_table());

}  // namespace llmd
