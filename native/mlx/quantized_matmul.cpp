#include "quantized_matmul.h"

#include <mlx/backend/cpu/encoder.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <vector>

#include "../core/op_profile.h"
#include "../core/scratch.h"
#include "../core/thread_pool.h"
#include "row_major.h"
#include "swiglu.h"

namespace llmd {

namespace {
// Activation rows a SwiGLU task multiplies at a time (the packed kernels' largest row chunk,
// qgemm_impl.h's packed_row_chunk).
constexpr int kSwigluRows = 128;

// Column tasks, as boundaries: threads take them from a shared counter, so a core slowed by
// something else (a noisy neighbour, a late wake-up) takes fewer instead of holding up the op.
// Guided sizes: each task is 1 / (2 x threads) of the columns still unassigned, so the first
// are large and the last few are one quantum: when one thread runs out of work the other is at
// most a small task from done. With equal sixths per thread, a 512-token prefill spent ~12% of
// its time in one thread waiting at the end of an op for the other's last task. Each column is
// computed the same way whichever task or thread takes it. The quantum is the kernel table's
// column_quantum (16, or 32 where the prefill kernels work on 32-column blocks).
const std::vector<int>& column_tasks(int n, int threads, int quantum) {
  thread_local std::vector<int> starts;
  thread_local int for_n = -1, for_threads = -1, for_quantum = -1;
  if (n == for_n && threads == for_threads && quantum == for_quantum) return starts;
  starts.assign(1, 0);
  for (int at = 0; at < n;) {
    const int share = (n - at + 2 * threads - 1) / (2 * threads);
    at = std::min(n, at + std::max(quantum, (share + quantum - 1) / quantum * quantum));
    starts.push_back(at);
  }
  for_n = n;
  for_threads = threads;
  for_quantum = quantum;
  return starts;
}

// RMS-normalise one row into `dst` (float accumulation in a fixed order: batch-invariant).
void rms_norm_row(const float* x, const float* w, float eps, int k, float* dst) {
  float ss = 0.f;
  for (int i = 0; i < k; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(k) + eps);
  for (int i = 0; i < k; ++i) dst[i] = x[i] * inv * w[i];
}

}  // namespace

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const QuantizedMatmulSpec& spec,
                           const std::optional<mx::array>& norm_weight, const std::optional<mx::array>& residual,
                           const kernels::KernelTable& table) {
  if (x.ndim() != 2 || x.shape(1) != spec.k) {
    throw std::invalid_argument("quantized_matmul: activations must be [rows, " + std::to_string(spec.k) + "]");
  }
  if (!(spec.packed ? table.packed_gemm_for(spec.type) : table.gemm_for(spec.type))) {
    throw std::invalid_argument("no CPU kernel for " + type_name(spec.type) + (spec.packed ? " (packed)" : ""));
  }
  if (spec.rms_norm != norm_weight.has_value()) throw std::invalid_argument("quantized_matmul: norm weight mismatch");
  if ((spec.epilogue == Epilogue::AddResidual) != residual.has_value()) {
    throw std::invalid_argument("quantized_matmul: residual mismatch");
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{float32_input(x, stream), w};
  if (norm_weight) inputs.push_back(float32_input(*norm_weight, stream));
  if (residual) inputs.push_back(float32_input(*residual, stream));
  return mx::array({x.shape(0), spec.out_features()}, mx::float32,
                   std::make_shared<QuantizedMatmul>(stream, spec, table), std::move(inputs));
}

std::vector<mx::Shape> QuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0), spec_.out_features()}};
}

bool QuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedMatmul&>(other);
  return o.spec_ == spec_ && &o.table_ == &table_;
}

void QuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("LlmdQuantizedMatmul has no GPU kernel in this build");
}

void QuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) encoder.set_input_array(in);
  encoder.set_output_array(out);
  const kernels::KernelTable* table = &table_;
  encoder.dispatch([inputs, out, spec = spec_, table]() mutable {
    ScopedOpTimer timer(OpKind::QuantizedMatmul);
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const int k = spec.k;
    const int n = spec.n;
    const int rows = x.shape(0);
    const size_t row_bytes = llmd::row_bytes(spec.type, k);
    const int nb = k / kernels::kBlock;
    const RowMajor x_rows(x);
    const std::optional<RowMajor> norm_rows = spec.rms_norm ? std::optional<RowMajor>(inputs[2]) : std::nullopt;
    const bool has_residual = spec.epilogue == Epilogue::AddResidual;
    const std::optional<RowMajor> residual_rows = has_residual ? std::optional<RowMajor>(inputs.back()) : std::nullopt;
    const float* norm_w = norm_rows ? norm_rows->data() : nullptr;
    const float* residual = residual_rows ? residual_rows->data() : nullptr;
    thread_local std::vector<kernels::ActBlock> act;
    kernels::ActBlock* ap = grow_scratch(act, static_cast<size_t>(rows) * nb);
    const float* xp = x_rows.data();
    auto& pool = ThreadPool::global();
    const kernels::QuantizeRowFn quantize = table->quantizer_for(spec.type);
    pool.parallel_for(rows, [&](int r0, int r1) {
      thread_local std::vector<float> normed;
      float* const normed_row = norm_w ? grow_scratch(normed, static_cast<size_t>(k)) : nullptr;
      for (int r = r0; r < r1; ++r) {
        const float* src = xp + static_cast<size_t>(r) * k;
        if (norm_w) {
          rms_norm_row(src, norm_w, spec.eps, k, normed_row);
          src = normed_row;
        }
        quantize(src, ap + static_cast<size_t>(r) * nb, k);
      }
    });
    const kernels::GemmFn gemm = spec.packed ? table->packed_gemm_for(spec.type) : table->gemm_for(spec.type);
    const uint8_t* wp = w.data<uint8_t>();
    float* op = out.data<float>();
    const int out_n = spec.out_features();
    const std::vector<int>& starts = column_tasks(n, pool.size(), table->column_quantum);
    pool.parallel_for_dynamic(static_cast<int>(starts.size()) - 1, [&](int t0, int t1) {
      const int n0 = starts[t0];
      const int n1 = starts[t1];
      if (spec.epilogue != Epilogue::SwiGLU) {
        gemm(wp, row_bytes, ap, k, rows, n0, n1, op, n);
        if (residual) {
          for (int r = 0; r < rows; ++r) {
            float* o = op + static_cast<size_t>(r) * n;
            const float* res = residual + static_cast<size_t>(r) * n;
            for (int j = n0; j < n1; ++j) o[j] += res[j];
          }
        }
        return;
      }
      // SwiGLU: columns (2i, 2i+1) are (gate_i, up_i); out[i] = silu(gate) * up. A chunk of
      // rows at a time, into a buffer the thread keeps (a whole task's gate/up products went to
      // a fresh vector, several MB of new pages every layer of a long prefill). Each output is
      // the same bits whichever chunk computes it (qgemm.h's isolation).
      const int width = n1 - n0;
      thread_local std::vector<float> tmp;
      float* const chunk_out = grow_scratch(tmp, static_cast<size_t>(std::min(kSwigluRows, rows)) * width);
      for (int r0 = 0; r0 < rows; r0 += kSwigluRows) {
        const int rc = std::min(kSwigluRows, rows - r0);
        gemm(wp + static_cast<size_t>(n0) * row_bytes, row_bytes, ap + static_cast<size_t>(r0) * nb, k, rc, 0, width,
             chunk_out, width);
        for (int r = 0; r < rc; ++r) {
          const float* t = chunk_out + static_cast<size_t>(r) * width;
          float* o = op + static_cast<size_t>(r0 + r) * out_n + n0 / 2;
          swiglu_pairs(t, o, width / 2);
        }
      }
    });
  });
}

}  // namespace llmd
