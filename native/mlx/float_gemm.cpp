#include "float_gemm.h"

#include <mlx/backend/cpu/encoder.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../core/op_profile.h"
#include "../core/thread_pool.h"
#include "row_major.h"
#include "simd.h"

namespace llmd {

// Cloned per ISA (simd.h); not in an anonymous namespace: target_clones needs the symbols.
namespace float_gemm_kernels {
using namespace simd;
static_assert(kFloatPanel == 2 * kLanes);

// Rows [0, R) x one panel: acc[r] = sum over k of x[r][k] * panel[k][0..16), then the first
// `cols` columns stored.
template <int R>
[[gnu::always_inline]] inline void tile(const float* x, int k, const float* panel, float* out, int ldo, int cols) {
  vf acc[R][2] = {};
  for (int kk = 0; kk < k; ++kk) {
    const vf b0 = load(panel + static_cast<size_t>(kk) * kFloatPanel);
    const vf b1 = load(panel + static_cast<size_t>(kk) * kFloatPanel + kLanes);
    for (int r = 0; r < R; ++r) {
      const float s = x[static_cast<size_t>(r) * k + kk];
      const vf a = {s, s, s, s, s, s, s, s};  // a broadcast load (splat() adds a 0.f first)
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = out + static_cast<size_t>(r) * ldo;
    if (cols == kFloatPanel) {
      store(o, acc[r][0]);
      store(o + kLanes, acc[r][1]);
    } else {
      for (int c = 0; c < cols; ++c) o[c] = c < kLanes ? acc[r][0][c] : acc[r][1][c - kLanes];
    }
  }
}

// Rows [0, rows) of x against panels [p0, p1): rows in chunks that stay in L2 across the
// panels, each chunk in 6-row register tiles.
LLMD_CLONES
void gemm_panels(const float* x, int rows, int k, const float* panels, int n, int p0, int p1, float* out) {
  constexpr int kRowTile = 6;
  const int chunk = std::max(kRowTile, (256 * 1024 / 4 / std::max(k, 1)) / kRowTile * kRowTile);
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int r1 = std::min(rows, r0 + chunk);
    for (int p = p0; p < p1; ++p) {
      const float* panel = panels + static_cast<size_t>(p) * k * kFloatPanel;
      const int c0 = p * kFloatPanel;
      const int cols = std::min(kFloatPanel, n - c0);
      int r = r0;
      for (; r + kRowTile <= r1; r += kRowTile) {
        tile<kRowTile>(x + static_cast<size_t>(r) * k, k, panel, out + static_cast<size_t>(r) * n + c0, n, cols);
      }
      const float* xr = x + static_cast<size_t>(r) * k;
      float* o = out + static_cast<size_t>(r) * n + c0;
      switch (r1 - r) {
        case 5: tile<5>(xr, k, panel, o, n, cols); break;
        case 4: tile<4>(xr, k, panel, o, n, cols); break;
        case 3: tile<3>(xr, k, panel, o, n, cols); break;
        case 2: tile<2>(xr, k, panel, o, n, cols); break;
        case 1: tile<1>(xr, k, panel, o, n, cols); break;
        default: break;
      }
    }
  }
}

}  // namespace float_gemm_kernels

namespace {

int n_panels(int n) { return (n + kFloatPanel - 1) / kFloatPanel; }

class FloatGemm : public mx::UnaryPrimitive {
 public:
  FloatGemm(mx::Stream s, int n, int k) : mx::UnaryPrimitive(s), n_(n), k_(k) {}
  const char* name() const override { return "LlmdFloatGemm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const FloatGemm&>(other);
    return o.n_ == n_ && o.k_ == k_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[0].shape(0), n_}};
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("LlmdFloatGemm has no GPU kernel");
  }
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, n = n_, k = k_]() mutable {
      ScopedOpTimer timer(OpKind::QuantizedMatmul);
      const RowMajor x(inputs[0]);
      float_gemm_rows(x.data(), inputs[0].shape(0), k, inputs[1].data<float>(), n, out.data<float>());
    });
  }

 private:
  int n_, k_;
};

}  // namespace

void float_gemm_rows(const float* x, int rows, int k, const float* panels, int n, float* out) {
  auto& pool = ThreadPool::global();
  const int np = n_panels(n);
  // A few tasks per thread (taken from a shared counter) so a slowed core takes fewer.
  const int tasks = std::min(np, pool.size() * 6);
  pool.parallel_for_dynamic(tasks, [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
      float_gemm_kernels::gemm_panels(x, rows, k, panels, n, np * t / tasks, np * (t + 1) / tasks, out);
    }
  });
}

mx::array pack_float_panels(const mx::array& w) {
  if (w.ndim() != 2) throw std::invalid_argument("pack_float_panels: weight must be 2-D");
  const int n = w.shape(0), k = w.shape(1);
  mx::array src = mx::contiguous(mx::astype(w, mx::float32));
  src.eval();
  const float* s = src.data<float>();
  std::vector<float> packed(static_cast<size_t>(n_panels(n)) * k * kFloatPanel, 0.f);
  for (int r = 0; r < n; ++r) {
    float* dst = packed.data() + static_cast<size_t>(r / kFloatPanel) * k * kFloatPanel + r % kFloatPanel;
    for (int c = 0; c < k; ++c) dst[static_cast<size_t>(c) * kFloatPanel] = s[static_cast<size_t>(r) * k + c];
  }
  mx::array out(packed.begin(), {static_cast<int>(packed.size())}, mx::float32);
  out.eval();
  return out;
}

mx::array float_gemm(const mx::array& x, const mx::array& panels, int n, int k) {
  if (x.ndim() != 2 || x.shape(1) != k) {
    throw std::invalid_argument("float_gemm: activations must be [rows, " + std::to_string(k) + "]");
  }
  const auto s = mx::default_stream(mx::Device::cpu);
  return mx::array({x.shape(0), n}, mx::float32, std::make_shared<FloatGemm>(s, n, k), {float32_input(x, s), panels});
}

}  // namespace llmd
