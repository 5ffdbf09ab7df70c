// A weight matrix and the path that multiplies by it: llmd's quantized kernels for GGUF block
// types, MLX's matmul for float weights. Built from one or more same-shaped-K tensors whose
// rows are stacked (q|k|v, gate|up), so a fused projection is one kernel call. Parts of
// different block types (llama.cpp's K-quant recipes put attn_v in Q6_K beside a Q4_K attn_q)
// become one Linear per run of same-typed parts whose outputs are concatenated.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "../core/gguf_file.h"
#include "../core/tensor_types.h"
#include "device_weight.h"
#include "float_gemm.h"

namespace llmd {

namespace mx = mlx::core;

class Linear {
 public:
  Linear() = default;
  // Stacks the rows of `parts` (each [n_i, k] in GGUF order shape {k, n_i}). With
  // `interleave_pairs` (two equal parts: gate, up) rows alternate gate_0, up_0, gate_1, ...
  // so a fused SwiGLU finds each pair in adjacent output columns. Parts of different types
  // are split into runs (gate and up then stay apart: the fused options run around the runs).
  // With `on_device`, the weight is converted to MLX's formats for the device backend
  // (device_weight.h) instead of staying in GGUF blocks for llmd's CPU kernels.
  static Linear from_gguf(const std::vector<const TensorView*>& parts, bool interleave_pairs = false,
                          bool on_device = false);
  // Float weights [n, k] already in memory (safetensors path); pairs are never interleaved.
  static Linear from_float(mx::array weight, bool on_device = false);
  // MLX affine-quantized weights as mlx-lm writes them (w = scale * q + bias per group of
  // `group` input columns; `w` uint32 [n_i, k * bits / 32], scales/biases [n_i, k / group]),
  // rows of the parts stacked. On the device backend they stay in MLX's format
  // (quantized_matmul); on the CPU backend 4-bit groups are repacked exactly into GGUF Q4_1
  // blocks for llmd's kernels (scale and bias as float16: done only when both survive that
  // conversion exactly, else MLX's quantized_matmul on the CPU runs the layer), and 8-bit
  // groups, which have no exact GGUF twin (Q8_0 has no bias), run MLX's quantized_matmul on
  // the CPU. `interleave_pairs` as in from_gguf (only the Q4_1 repack needs it).
  struct MlxQuantized {
    mx::array w, scales, biases;
  };
  static Linear from_mlx_quantized(const std::vector<MlxQuantized>& parts, int bits, int group, bool on_device,
                                   bool interleave_pairs = false);
  // Linears of one input width whose outputs are concatenated (parts stored in different
  // formats); the fused options run around them: gate and up as two pieces give a SwiGLU.
  static Linear concatenated(std::vector<Linear> pieces);

  // Row-wise work fused around the product (one kernel pass on the quantized path).
  struct Fused {
    std::optional<mx::array> rms_norm_weight;  // normalise x first
    float eps = 1e-5f;
    std::optional<mx::array> residual;         // add to the result
    bool swiglu = false;                       // silu(gate) * up over the two halves/pairs
  };
  mx::array operator()(const mx::array& x, const Fused& fused) const;
  mx::array operator()(const mx::array& x) const { return (*this)(x, Fused{}); }

  // gelu?(x @ W^T + bias) + residual: an encoder layer's work around a matmul. Host float
  // panels (use_host_float_gemm) do it inside the GEMM, as the output is stored; other weights
  // run the same maths as separate ops after the product.
  mx::array with_epilogue(const mx::array& x, const FloatGemmEpilogue& epilogue) const;

  // Float weights on the host backend: run llmd's own GEMM (float_gemm.h, on llmd's threads)
  // instead of MLX's matmul (the linked BLAS, whose threads contend with llmd's), its panels
  // replacing the [n, k] copy; F16 GGUF weights stay float16 in the panels where the kernel
  // takes them (float16_panels_supported). Nothing changes for quantized, device or split
  // weights.
  void use_host_float_gemm();

  int out_features() const { return n_; }
  bool quantized() const { return quantized_; }
  TensorType type() const { return type_; }
  // The stored weight: uint8 [n, row_bytes] blocks, or float32 [n, k].
  const mx::array& weight() const { return weight_; }
  // Whether the blocks are in the 8-row packed layout of the x86 kernels (kernels/pack8.h)
  // rather than GGUF's row-major one.
  bool packed() const { return packed_; }
  int in_features() const { return k_; }
  // Bytes the weight keeps resident (blocks, or packed weights with scales and biases).
  size_t resident_bytes() const;
  bool on_device() const {
    return pieces_.empty() ? device_.has_value() && !host_mlx_ : pieces_.front().on_device();
  }
  // "llmd:q4_1:avx512vnni", "mlx:matmul:f32", "llmd:f16:gemm", or on the device backend
  // "mlx:qmm:q4_1->affine4:gpu"; MLX-quantized checkpoints run "mlx:qmm:affine4g64:gpu" (or
  // ":cpu" where MLX's kernel runs on the CPU backend) or "llmd:q4_1:<isa>".
  // A split Linear reports its runs' paths joined by '+'.
  std::string path() const;

 private:
  TensorType type_ = TensorType::F32;
  bool quantized_ = false;
  bool interleaved_ = false;
  bool packed_ = false;
  int n_ = 0;
  int k_ = 0;
  mx::array weight_{0.f};  // uint8 [n, row_bytes] when quantized, float32 [n, k] otherwise
  std::optional<DeviceWeight> device_;  // replaces weight_ on the device backend
  std::string device_name_;
  std::string mlx_format_;  // "affine4g64": MLX-quantized source kept in MLX's format
  bool host_mlx_ = false;   // MLX's quantized_matmul on the CPU backend (not the device backend)
  bool float_panels_ = false;  // weight_ holds float_gemm.h's packed panels (use_host_float_gemm)
  // Runs of same-typed parts when the parts' types differ (then nothing above but n_, k_,
  // type_ (the first run's) and quantized_ is set): their outputs are concatenated.
  std::vector<Linear> pieces_;
  // Packs quantized blocks in place into the layout the active kernels run fastest on.
  void pack_for_kernels();
  mx::array device_forward(const mx::array& x, const Fused& fused) const;
  mx::array split_forward(const mx::array& x, const Fused& fused) const;
};

// While one of these lives on a thread, Linear::from_gguf and copy_bytes check what they are
// given but keep no bytes (LoadOptions::validate_only: the pull-time support check).
class SkipWeightBytes {
 public:
  SkipWeightBytes();
  ~SkipWeightBytes();
  SkipWeightBytes(const SkipWeightBytes&) = delete;
  SkipWeightBytes& operator=(const SkipWeightBytes&) = delete;
  static bool active();

 private:
  bool previous_;
};

// An evaluated, MLX-owned uint8 buffer of n bytes for weights copied out of a mapped file.
mx::array owned_bytes(size_t n);

// A float copy of a 1-D or 2-D GGUF tensor (norm weights, small tensors).
mx::array dequantize_tensor(const TensorView& t);

}  // namespace llmd
