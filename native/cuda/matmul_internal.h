// Private to the matmul_* files (and the matmul tests, which check the layouts): the byte
// layouts DeviceMatrix and Activations hold, and the kernel launchers the cuBLAS file calls.
//
// Weight layouts (`data` / `aux` of a DeviceMatrix), every bit of the file kept:
//   F16        data [rows][cols] half.
//   Q4_0       data [rows][cols/32][16] the blocks' quant bytes; aux [rows][cols/32] half d.
//   Q8_0       data [rows][cols/32][32] int8;                     aux [rows][cols/32] half d.
//   Q4_K/Q5_K  data [rows][cols/256] the file's blocks as they are (144 / 176 bytes: multiples of 16, so every
//              block starts 16-byte aligned); no aux.
//   Q6_K       data [rows][cols/256][208] ql|qh|scales; aux [rows][cols/256] half d (the file's block is 210
//              bytes, whose 2-byte tail would misalign every following block).
//   MlxAffine4 data [rows][cols/32][16]: each 32 weights' nibbles permuted into Q4_0's order (byte j = q[j] |
//              q[j+16] << 4) so the integer dot needs no shuffle; aux [rows][cols/group] (half scale, half bias).
//   MlxAffine8 data [rows][cols] uint8 (the file's words, little-endian: byte k is weight k); aux as above.
//
// q8 activations (Activations::q8()): for `rows` rows of cols32 = round_up(cols, 32) values,
//   codes  int8 [rows][cols32] at offset 0 (row stride cols32, so every block of 32 is 32-byte aligned);
//   ds     float2 [rows][cols32/32] at q8_ds_offset(max_rows, max_cols): (d, d * sum of the block's codes),
//          value ~= d * code; the sum lets formats with an offset (Q4_0's -8, K-quant mins, MLX biases) apply
//          it once per block instead of per weight.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "matmul.h"

namespace llmd::cuda::detail {

inline constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }
inline size_t q8_ds_offset(int max_rows, int max_cols) {
  return (size_t(max_rows) * round_up(max_cols, 32) + 255) / 256 * 256;
}
inline size_t q8_bytes(int max_rows, int max_cols) {
  return q8_ds_offset(max_rows, max_cols) + size_t(max_rows) * (round_up(max_cols, 32) / 32) * sizeof(float2);
}

// What a kernel needs of a DeviceMatrix (plain pointers: kernels take no C++ owners).
struct WeightView {
  const uint8_t* data;
  const uint8_t* aux;
  int rows;
  int cols;
  int group_size;
};
inline WeightView view(const DeviceMatrix& w) {
  return {w.data.as<const uint8_t>(), w.aux.as<const uint8_t>(), w.rows, w.cols, w.group_size};
}

// A matrix laid out on the host, as the upload copies it to the device (split from the upload so the layout can be
// checked without a GPU).
struct HostLayout {
  WeightFormat format = WeightFormat::F16;
  int rows = 0;
  int cols = 0;
  int group_size = 0;
  std::vector<uint8_t> data;
  std::vector<uint8_t> aux;
};
HostLayout layout_gguf(TensorType type, const GgufPart* parts, int n_parts, int cols);
HostLayout layout_mlx_affine(int bits, int group_size, const uint32_t* w, const uint16_t* scales,
                             const uint16_t* biases, int rows, int cols);

// Dequantizes w into a [rows][cols] float16 matrix (the prefill path's cuBLAS operand).
void launch_dequantize_f16(const DeviceMatrix& w, __half* out, cudaStream_t stream);
// x float32 [rows][cols] (row stride ldx) -> out float16 [rows][cols] (contiguous).
void launch_f32_to_f16(const float* x, int ldx, int rows, int cols, __half* out, cudaStream_t stream);
// y[r][i] = silu(t[r][i]) * t[r][i + half] for i < half (t row stride 2 * half, y row stride ldy).
void launch_swiglu(const float* t, int rows, int half, float* y, int ldy, cudaStream_t stream);
// The batched-decode tensor-core path (matmul_mma.cu): quantized formats, 9..gemv_row_limit() rows, unless
// LLMD_CUDA_MMA=0 (read at every call, as LLMD_CUDA_GEMV_ROWS, so a run can compare it with the GEMV).
inline constexpr int kMinMmaRows = 9;
bool use_mma(const DeviceMatrix& w, int rows);
void mma_matmul(const DeviceMatrix& w, const Activations& x, float* y, int ldy, Epilogue epilogue,
                cudaStream_t stream);
// The mma path's weight decoders alone: w as a [rows][cols] float16 matrix (tests compare it with
// launch_dequantize_f16).
void mma_decode_f16(const DeviceMatrix& w, __half* out, cudaStream_t stream);
// The prefill path (matmul_cublas.cpp): x.rows > kMaxGemvBatch.
void prefill_matmul(MatmulContext& ctx, const DeviceMatrix& w, const Activations& x, float* y, int ldy,
                    Epilogue epilogue, cudaStream_t stream);

}  // namespace llmd::cuda::detail
