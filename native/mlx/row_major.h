// Row-major float data of a primitive's input, without an mx::contiguous node in the graph.
//
// Why: wrapping every input of every matmul and attention in mx::contiguous added ~300 MLX
// nodes to each decode step, each scheduled and evaluated although the arrays almost always
// are row-major already (the outputs of llmd's primitives and the loaded weights are). The
// primitives read their inputs through this instead: the array's own buffer when its rows are
// contiguous, else a row-major copy made in the kernel.
#pragma once

#include <mlx/mlx.h>

#include <stdexcept>
#include <vector>

namespace llmd {

// A primitive's float input as given, or cast when it is another dtype: with RowMajor in the
// kernel, no other node is needed in front of the primitive.
inline mlx::core::array float32_input(const mlx::core::array& a, mlx::core::Stream stream) {
  return a.dtype() == mlx::core::float32 ? a : mlx::core::astype(a, mlx::core::float32, stream);
}

class RowMajor {
 public:
  // `a`: float32, 1-D or 2-D, evaluated (its data is available).
  explicit RowMajor(const mlx::core::array& a) {
    if (a.flags().row_contiguous) {
      ptr_ = a.data<float>();
      return;
    }
    if (a.ndim() > 2) throw std::invalid_argument("RowMajor: only 1-D and 2-D arrays");
    const int rows = a.ndim() == 2 ? a.shape(0) : 1;
    const int cols = a.shape(a.ndim() - 1);
    const int64_t rs = a.ndim() == 2 ? a.strides()[0] : 0;
    const int64_t cs = a.strides()[a.ndim() - 1];
    const float* src = a.data<float>();
    copy_.resize(static_cast<size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) copy_[static_cast<size_t>(r) * cols + c] = src[r * rs + c * cs];
    }
    ptr_ = copy_.data();
  }
  const float* data() const { return ptr_; }

 private:
  std::vector<float> copy_;
  const float* ptr_ = nullptr;
};

}  // namespace llmd
