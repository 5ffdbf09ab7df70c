#include "quantized_matmul.h"

#include <mlx/backend/cpu/encoder.h>

#include <stdexcept>
#include <vector>

#include "../core/thread_pool.h"

namespace llmd {

namespace {
// Output columns handed to one pool task: large enough to amortise the hand-out, small
// enough that 2..16 threads get an even share of a 192-row K/V projection.
constexpr int kColumnsPerTask = 16;
}  // namespace

mx::array quantized_matmul(const mx::array& x, const mx::array& w, TensorType type, int n, int k,
                           const kernels::KernelTable& table) {
  if (x.shape(-1) != k) {
    throw std::invalid_argument("quantized_matmul: activation width " +
                                std::to_string(x.shape(-1)) + " != weight width " +
                                std::to_string(k));
  }
  if (!table.gemm_for(type)) {
    throw std::invalid_argument("no CPU kernel for " + type_name(type));
  }
  auto shape = x.shape();
  shape.back() = n;
  const auto stream = mx::default_stream(mx::Device::cpu);
  auto xin = mx::contiguous(mx::astype(x, mx::float32, stream), false, stream);
  return mx::array(shape, mx::float32,
                   std::make_shared<QuantizedMatmul>(stream, type, n, k, table), {xin, w});
}

std::vector<mx::Shape> QuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  shape.back() = n_;
  return {shape};
}

bool QuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedMatmul&>(other);
  return o.type_ == type_ && o.n_ == n_ && o.k_ == k_ && &o.table_ == &table_;
}

void QuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("LlmdQuantizedMatmul has no GPU kernel in this build");
}

void QuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const mx::array& x = inputs[0];
  const mx::array& w = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_input_array(w);
  encoder.set_output_array(out);
  const int rows = static_cast<int>(x.size() / k_);
  const TensorType type = type_;
  const int n = n_;
  const int k = k_;
  const kernels::KernelTable* table = &table_;
  encoder.dispatch([x, w, out, rows, type, n, k, table]() mutable {
    const size_t row_bytes = llmd::row_bytes(type, k);
    const int nb = k / kernels::kBlock;
    thread_local std::vector<kernels::ActBlock> act;
    act.resize(static_cast<size_t>(rows) * nb);
    const float* xp = x.data<float>();
    auto& pool = ThreadPool::global();
    kernels::ActBlock* ap = act.data();
    pool.parallel_for(rows, [&](int r0, int r1) {
      for (int r = r0; r < r1; ++r) table->quantize_row(xp + static_cast<size_t>(r) * k, ap + static_cast<size_t>(r) * nb, k);
    });
    const kernels::GemmFn gemm = table->gemm_for(type);
    const uint8_t* wp = w.data<uint8_t>();
    float* op = out.data<float>();
    const int tasks = (n + kColumnsPerTask - 1) / kColumnsPerTask;
    pool.parallel_for(tasks, [&](int t0, int t1) {
      const int n0 = t0 * kColumnsPerTask;
      const int n1 = std::min(n, t1 * kColumnsPerTask);
      gemm(wp, row_bytes, ap, k, rows, n0, n1, op, n);
    });
  });
}

}  // namespace llmd
