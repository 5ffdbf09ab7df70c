// Quantized matrix products on the GPU over GGUF blocks (and MLX's affine layout), with the
// small operations around them fused in: the RMS norm and the activation quantization run as
// one prologue kernel, the residual add and SwiGLU run in the product's epilogue. Why: on an
// 8B model a decode step is bound by reading the weights once; MLX's generic kernels reached
// 24-41% of the copy bandwidth and spent ~40% of the step in tiny launches around them
// (bench/README.md, "GPU: llmd (MLX CUDA backend) vs llama.cpp's CUDA build").
//
// Decode (batch <= kMaxGemvBatch rows): one kernel per matrix reads every weight block once and
// dots it with all rows' activations (int8 dot products against the activations quantized to
// 8 bits per 32, as llama.cpp's MMVQ does). Prefill (more rows): the matrix is dequantized to
// float16 into a scratch buffer and multiplied by cuBLAS on the tensor cores.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "../core/tensor_types.h"
#include "device_buffer.h"

namespace llmd::cuda {

// Formats a DeviceMatrix holds. Every GGUF type the loader meets that has no kernel of its own
// is converted to F16 at upload (exact for F16/BF16/F32 within float16's range; a dequantized
// copy of other quantized types), so every model runs, the fast formats at full speed.
enum class WeightFormat { F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, MlxAffine4, MlxAffine8 };
const char* format_name(WeightFormat f);

// The most activation rows one GEMV launch takes; more rows go through the prefill path.
inline constexpr int kMaxGemvBatch = 32;
// The most rows matmul() actually sends through the GEMV kernels: kMaxGemvBatch, or fewer when
// the environment sets LLMD_CUDA_GEMV_ROWS (read at every call, so a benchmark can measure both
// paths at the batch sizes where either applies; matmul_policy.cpp).
int gemv_row_limit();

// A weight matrix [rows][cols] on the device (y = W x: `cols` is the input size). The byte
// layout inside `data`/`aux` is private to matmul.cu: the upload may re-lay a GGUF tensor's
// blocks out for aligned, coalesced loads (e.g. the quants of a row contiguous and the scales
// apart), but keeps every bit: no requantization, the same bytes per weight as the file.
struct DeviceMatrix {
  WeightFormat format = WeightFormat::F16;
  int rows = 0;
  int cols = 0;
  int group_size = 0;  // MLX affine only
  DeviceBuffer data;
  DeviceBuffer aux;
  size_t bytes() const { return data.bytes() + aux.bytes(); }
};

// Uploads one GGUF tensor as stored in the file (row-major: `rows` rows of `cols` elements in
// `type`'s blocks). Types without their own kernel become F16 (see WeightFormat).
DeviceMatrix upload_gguf_matrix(TensorType type, const void* host, int rows, int cols);
// Several GGUF tensors of one type and the same `cols`, stacked row-wise into one matrix (the
// fused q|k|v and gate|up products: one launch, one pass over the activations). Every part
// must have the same type; the caller checks and falls back to separate matrices otherwise.
struct GgufPart {
  const void* host;
  int rows;
};
DeviceMatrix upload_gguf_stacked(TensorType type, const GgufPart* parts, int n_parts, int cols);
// An MLX-quantized matrix: `w` packs `bits` (4 or 8) per weight into uint32 words, row-major
// [rows][cols * bits / 32]; `scales` and `biases` are float16 bits [rows][cols / group_size];
// weight = scale * q + bias.
DeviceMatrix upload_mlx_affine(int bits, int group_size, const uint32_t* w, const uint16_t* scales,
                               const uint16_t* biases, int rows, int cols);

// Activations of `rows` rows of `cols` values, in the two forms the products read: float32
// (the prefill path, F16 weights, and anything that needs exact values) and 8-bit blocks of 32
// with a scale and the block's sum (the integer-dot decode kernels). Owned buffers sized for
// max_rows x max_cols; `rows`/`cols` say what the last prologue wrote.
class Activations {
 public:
  Activations(int max_rows, int max_cols);
  float* f32() const { return f32_.as<float>(); }  // [rows][cols], row stride cols (as the last prologue wrote)
  void* q8() const { return q8_.get(); }
  int max_rows() const { return max_rows_; }
  int max_cols() const { return max_cols_; }
  int rows = 0;
  int cols = 0;

 private:
  int max_rows_;
  int max_cols_;
  DeviceBuffer f32_;
  DeviceBuffer q8_;
};

// The prologue: out = x * rsqrt(mean(x^2) + eps) * norm_weight for each of `rows` rows of `cols`
// values (x row stride ldx), written to out.f32() and quantized into out.q8(). With
// norm_weight == nullptr no norm is applied (the input is only quantized: the attention output
// and SwiGLU's result before their products). Sets out.rows / out.cols.
void rmsnorm_quantize(const float* x, int ldx, const float* norm_weight, float eps, int rows, int cols,
                      Activations& out, cudaStream_t stream);
inline void quantize_activations(const float* x, int ldx, int rows, int cols, Activations& out,
                                 cudaStream_t stream) {
  rmsnorm_quantize(x, ldx, nullptr, 0.0f, rows, cols, out, stream);
}

enum class Epilogue {
  Store,   // y[r][i] = (W x_r)[i]
  Add,     // y[r][i] += (W x_r)[i]: the residual stream, updated in place
  SwiGLU,  // W stacks gate (rows/2) over up (rows/2): y[r][i] = silu(gate_i) * up_i, i < rows/2
};

// Scratch and library handles the products need (cuBLAS handle, float16 scratch for the
// prefill path), created once per model. Not thread-safe: one per stream.
class MatmulContext {
 public:
  // max_rows: most activation rows of any call (the step token budget); max_weight_elements:
  // the largest matrix (rows * cols) that may go through the prefill path.
  MatmulContext(int max_rows, size_t max_weight_elements, cudaStream_t stream);
  ~MatmulContext();
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// y (row stride ldy, at least w.rows or w.rows / 2 for SwiGLU) from x.rows rows of x. Rows <=
// kMaxGemvBatch: the fused GEMV kernels, or for 9+ rows of a quantized format the tensor-core
// kernel (matmul_mma.cu; LLMD_CUDA_MMA=0 sends those back to the GEMV); both allocate nothing and
// never sync the host: safe inside a CUDA graph capture. More rows: dequantize + cuBLAS (not
// captured: prefill steps run eagerly).
void matmul(MatmulContext& ctx, const DeviceMatrix& w, const Activations& x, float* y, int ldy, Epilogue epilogue,
            cudaStream_t stream);

// out[i][:] = row ids[i] of w, as float32 (the token embedding lookup; ids on the device).
void gather_rows(const DeviceMatrix& w, const int32_t* ids, int n, float* out, cudaStream_t stream);

// Which kernel matmul() ran for (w, rows): e.g. "gemv:q4_0:dp4a" or "gemm:cublas_f16": the engine
// reports it (Model::matmul_paths) so a test can assert the fast path is the one on the hot path.
const char* matmul_path(const DeviceMatrix& w, int rows);

}  // namespace llmd::cuda
