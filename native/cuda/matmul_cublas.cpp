// The prefill path of matmul.h (more than kMaxGemvBatch activation rows): the matrix dequantized to float16 into
// the context's scratch, the activations cast to float16, one cuBLAS GEMM on the tensor cores (float32
// accumulation and output), and the epilogue (Add as beta = 1; SwiGLU as a small kernel over a float32 scratch).
// Every cuBLAS call of llmd lives in this file, so a compile-only check without cuBLAS can leave it out.
#include <cublas_v2.h>

#include <stdexcept>
#include <string>

#include "matmul.h"
#include "matmul_internal.h"

#define LLMD_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                      \
    const cublasStatus_t llmd_cublas_st_ = (call);                                                          \
    if (llmd_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      throw std::runtime_error(std::string("cuBLAS error ") + cublasGetStatusString(llmd_cublas_st_) +     \
                               " in " #call " at " __FILE__ ":" + std::to_string(__LINE__));              \
  } while (0)

namespace llmd::cuda {

struct MatmulContext::Impl {
  cublasHandle_t handle = nullptr;
  DeviceBuffer weights_f16;  // the dequantized matrix
  DeviceBuffer acts_f16;     // the activations as float16
  DeviceBuffer swiglu_f32;   // gate|up products before SwiGLU

  // Grows a scratch buffer (the prefill path runs eagerly, never inside a graph capture): waits for the stream's
  // earlier work, which may still read the old buffer, before freeing it.
  void ensure(DeviceBuffer& buf, size_t bytes, cudaStream_t stream) {
    if (buf.bytes() >= bytes) return;
    LLMD_CUDA_CHECK(cudaStreamSynchronize(stream));
    buf = DeviceBuffer();
    buf = DeviceBuffer(bytes);
  }
};

MatmulContext::MatmulContext(int max_rows, size_t max_weight_elements, cudaStream_t stream)
    : impl_(std::make_unique<Impl>()) {
  LLMD_CUBLAS_CHECK(cublasCreate(&impl_->handle));
  LLMD_CUBLAS_CHECK(cublasSetStream(impl_->handle, stream));
  impl_->weights_f16 = DeviceBuffer(max_weight_elements * sizeof(__half));
  (void)max_rows;  // the activation scratch depends on the columns too: sized at first use
}

MatmulContext::~MatmulContext() {
  if (impl_ && impl_->handle != nullptr) cublasDestroy(impl_->handle);
}

namespace detail {

void prefill_matmul(MatmulContext& ctx, const DeviceMatrix& w, const Activations& x, float* y, int ldy,
                    Epilogue epilogue, cudaStream_t stream) {
  MatmulContext::Impl& I = ctx.impl();
  LLMD_CUBLAS_CHECK(cublasSetStream(I.handle, stream));
  const __half* wh = w.data.as<const __half>();
  if (w.format != WeightFormat::F16) {
    I.ensure(I.weights_f16, size_t(w.rows) * w.cols * sizeof(__half), stream);
    launch_dequantize_f16(w, I.weights_f16.as<__half>(), stream);
    wh = I.weights_f16.as<const __half>();
  }
  I.ensure(I.acts_f16, size_t(x.rows) * x.cols * sizeof(__half), stream);
  launch_f32_to_f16(x.f32(), x.cols, x.rows, x.cols, I.acts_f16.as<__half>(), stream);
  // Row-major W [rows][cols] is column-major W^T (lda = cols); row-major X [n][cols] is column-major X^T; the
  // column-major product W * X^T ([rows][n], ldc) is row-major Y [n][ldc].
  float* out = y;
  int ldc = ldy;
  if (epilogue == Epilogue::SwiGLU) {
    I.ensure(I.swiglu_f32, size_t(x.rows) * w.rows * sizeof(float), stream);
    out = I.swiglu_f32.as<float>();
    ldc = w.rows;
  }
  const float alpha = 1.0f, beta = epilogue == Epilogue::Add ? 1.0f : 0.0f;
  LLMD_CUBLAS_CHECK(cublasGemmEx(I.handle, CUBLAS_OP_T, CUBLAS_OP_N, w.rows, x.rows, w.cols, &alpha, wh, CUDA_R_16F,
                                 w.cols, I.acts_f16.get(), CUDA_R_16F, x.cols, &beta, out, CUDA_R_32F, ldc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (epilogue == Epilogue::SwiGLU) launch_swiglu(out, x.rows, w.rows / 2, y, ldy, stream);
}

}  // namespace detail
}  // namespace llmd::cuda
