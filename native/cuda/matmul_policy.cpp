// gemv_row_limit (matmul.h) and use_mma (matmul_internal.h): the per-call path switches.
#include <algorithm>
#include <cstdlib>

#include "matmul.h"
#include "matmul_internal.h"

namespace llmd::cuda {

int gemv_row_limit() {
  const char* v = std::getenv("LLMD_CUDA_GEMV_ROWS");
  if (v == nullptr || *v == '\0') return kMaxGemvBatch;
  return std::clamp(std::atoi(v), 1, kMaxGemvBatch);
}

namespace detail {

bool use_mma(const DeviceMatrix& w, int rows) {
  if (rows < kMinMmaRows || rows > gemv_row_limit() || w.format == WeightFormat::F16) return false;
  const char* v = std::getenv("LLMD_CUDA_MMA");
  return v == nullptr || *v == '\0' || std::atoi(v) != 0;
}

}  // namespace detail

}  // namespace llmd::cuda
