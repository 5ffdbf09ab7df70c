// gemv_row_limit (matmul.h).
#include <algorithm>
#include <cstdlib>

#include "matmul.h"

namespace llmd::cuda {

int gemv_row_limit() {
  const char* v = std::getenv("LLMD_CUDA_GEMV_ROWS");
  if (v == nullptr || *v == '\0') return kMaxGemvBatch;
  return std::clamp(std::atoi(v), 1, kMaxGemvBatch);
}

}  // namespace llmd::cuda
