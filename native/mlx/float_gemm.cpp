#include "float_gemm.h"

#include "float_gemm_check.h"

#include <mlx/backend/cpu/encoder.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/huge_pages.h"
#include "../core/op_profile.h"
#include "../core/thread_pool.h"
#if defined(__x86_64__)
#include "kernels/float_gemm_avx512.h"
#endif
#include "kernels/qgemm.h"
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

// The epilogue over finished rows [r0, r1) of out (the kernels without a fused one).
LLMD_CLONES
void epilogue_rows(float* out, int r0, int r1, int n, const float* bias, bool gelu, const float* residual) {
  for (int r = r0; r < r1; ++r) {
    float* o = out + static_cast<size_t>(r) * n;
    const float* res = residual ? residual + static_cast<size_t>(r) * n : nullptr;
    int c = 0;
    for (; c + kLanes <= n; c += kLanes) {
      vf v = load(o + c);
      if (bias) v += load(bias + c);
      if (gelu) v = gelu_tanh_n<vf, vfi>(v);
      if (res) v = load(res + c) + v;
      store(o + c, v);
    }
    for (; c < n; ++c) {  // the tail through one zero-padded vector: the same arithmetic
      vf v{};
      v[0] = o[c];
      if (bias) v[0] += bias[c];
      if (gelu) v = gelu_tanh_n<vf, vfi>(v);
      if (res) v[0] = res[c] + v[0];
      o[c] = v[0];
    }
  }
}

}  // namespace float_gemm_kernels

namespace {

int n_panels(int n) { return (n + kFloatPanel - 1) / kFloatPanel; }

struct EpilogueFlags {
  bool bias = false, gelu = false, residual = false;
  bool operator==(const EpilogueFlags&) const = default;
};

bool use_avx512() {
#if defined(__x86_64__)
  // The avx512vnni matmul path implies AVX-512 F/BW/VL and F16C (as for the attention kernels).
  static const bool yes = std::string(kernels::active_table().isa) == "avx512vnni";
  return yes;
#else
  return false;
#endif
}

// out = x @ W^T with the epilogue, rows split over panels on llmd's pool.
void run_gemm(const float* x, int rows, int k, const void* panels, bool half, int n, float* out, const float* bias,
              bool gelu, const float* residual) {
  auto& pool = ThreadPool::global();
  const int np = n_panels(n);
#if defined(__x86_64__)
  if (use_avx512()) {
    // Tasks over pairs of panels (the kernel's 2-panel tile), a few per thread, taken from a
    // shared counter so a slowed core takes fewer.
    const int pairs = (np + 1) / 2;
    const int tasks = std::min(pairs, pool.size() * 6);
    const float_gemm_avx512::Epilogue e{bias, gelu, residual};
    pool.parallel_for_dynamic(tasks, [&](int t0, int t1) {
      for (int t = t0; t < t1; ++t) {
        const int p0 = 2 * (pairs * t / tasks), p1 = std::min(np, 2 * (pairs * (t + 1) / tasks));
        float_gemm_avx512::gemm_panels(x, rows, k, panels, half, n, p0, p1, out, e);
      }
    });
    return;
  }
#endif
  if (half) throw std::logic_error("float16 panels need the AVX-512 float GEMM");
  float_gemm_rows(x, rows, k, static_cast<const float*>(panels), n, out);
  if (bias || gelu || residual) {
    const int tasks = std::max(1, std::min(rows, pool.size() * 4));
    pool.parallel_for(tasks, [&](int t0, int t1) {
      float_gemm_kernels::epilogue_rows(out, rows * t0 / tasks, rows * t1 / tasks, n, bias, gelu, residual);
    });
  }
}

class FloatGemm : public mx::UnaryPrimitive {
 public:
  FloatGemm(mx::Stream s, int n, int k, EpilogueFlags e) : mx::UnaryPrimitive(s), n_(n), k_(k), e_(e) {}
  const char* name() const override { return "LlmdFloatGemm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const FloatGemm&>(other);
    return o.n_ == n_ && o.k_ == k_ && o.e_ == e_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[0].shape(0), n_}};
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("LlmdFloatGemm has no GPU kernel");
  }
  // inputs: x, panels, [bias], [residual]
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, n = n_, k = k_, e = e_]() mutable {
      ScopedOpTimer timer(OpKind::QuantizedMatmul);
      const RowMajor x(inputs[0]);
      size_t next = 2;
      const std::optional<RowMajor> bias = e.bias ? std::optional<RowMajor>(inputs[next++]) : std::nullopt;
      const std::optional<RowMajor> res = e.residual ? std::optional<RowMajor>(inputs[next]) : std::nullopt;
      const mx::array& panels = inputs[1];
      const bool half = panels.dtype() == mx::float16;
      const void* p = half ? static_cast<const void*>(panels.data<mx::float16_t>())
                           : static_cast<const void*>(panels.data<float>());
      run_gemm(x.data(), inputs[0].shape(0), k, p, half, n, out.data<float>(), bias ? bias->data() : nullptr, e.gelu,
               res ? res->data() : nullptr);
    });
  }

 private:
  int n_, k_;
  EpilogueFlags e_;
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

bool float16_panels_supported() { return use_avx512(); }

namespace {

// [n, k] -> [n_panels][k][16] (zero-padded columns) as T, written straight into the array's
// buffer (one pass over the weight: a load-time cost of every F16 tower).
template <typename T>
mx::array pack_panels(const mx::array& w, mx::Dtype dtype) {
  if (w.ndim() != 2) throw std::invalid_argument("pack_float_panels: weight must be 2-D");
  const int n = w.shape(0), k = w.shape(1);
  mx::array src = mx::contiguous(mx::astype(w, mx::float32));
  src.eval();
  const float* s = src.data<float>();
  const size_t count = static_cast<size_t>(n_panels(n)) * k * kFloatPanel;
  mx::allocator::Data data = mx::allocator::malloc(count * sizeof(T));
  T* packed = static_cast<T*>(data.buffer().raw_ptr());
  advise_huge_pages(packed, count * sizeof(T));  // read whole by every product, as the weights of linear.cpp
  const size_t last = static_cast<size_t>(n / kFloatPanel) * k * kFloatPanel;  // a part-filled panel's zeros
  if (n % kFloatPanel) std::fill(packed + last, packed + count, T(0.f));
  for (int r = 0; r < n; ++r) {
    T* dst = packed + static_cast<size_t>(r / kFloatPanel) * k * kFloatPanel + r % kFloatPanel;
    const float* row = s + static_cast<size_t>(r) * k;
    for (int c = 0; c < k; ++c) dst[static_cast<size_t>(c) * kFloatPanel] = static_cast<T>(row[c]);
  }
  return mx::array(std::move(data), {static_cast<int>(count)}, dtype);
}

}  // namespace

mx::array pack_float_panels(const mx::array& w) { return pack_panels<float>(w, mx::float32); }

mx::array pack_float16_panels(const mx::array& w) {
  if (!float16_panels_supported()) throw std::logic_error("float16 panels need the AVX-512 float GEMM");
  return pack_panels<mx::float16_t>(w, mx::float16);
}

mx::array float_gemm(const mx::array& x, const mx::array& panels, int n, int k, const FloatGemmEpilogue& epilogue) {
  if (x.ndim() != 2 || x.shape(1) != k) {
    throw std::invalid_argument("float_gemm: activations must be [rows, " + std::to_string(k) + "]");
  }
  const auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {float32_input(x, s), panels};
  EpilogueFlags flags;
  if (epilogue.bias) {
    flags.bias = true;
    inputs.push_back(float32_input(*epilogue.bias, s));
  }
  flags.gelu = epilogue.gelu_tanh;
  if (epilogue.residual) {
    if (epilogue.residual->ndim() != 2 || epilogue.residual->shape(0) != x.shape(0) ||
        epilogue.residual->shape(1) != n) {
      throw std::invalid_argument("float_gemm: the residual must be [rows, " + std::to_string(n) + "]");
    }
    flags.residual = true;
    inputs.push_back(float32_input(*epilogue.residual, s));
  }
  return mx::array({x.shape(0), n}, mx::float32, std::make_shared<FloatGemm>(s, n, k, flags), std::move(inputs));
}

std::vector<float> float_gemm_check(const float* x, int rows, int k, const float* w, int n, bool half,
                                    const float* bias, bool gelu_tanh, const float* residual) {
  const mx::array weight(w, {n, k}, mx::float32);
  FloatGemmEpilogue e;
  if (bias) e.bias = mx::array(bias, {n}, mx::float32);
  e.gelu_tanh = gelu_tanh;
  if (residual) e.residual = mx::array(residual, {rows, n}, mx::float32);
  mx::array y = float_gemm(mx::array(x, {rows, k}, mx::float32),
                           half ? pack_float16_panels(weight) : pack_float_panels(weight), n, k, e);
  y.eval();
  return std::vector<float>(y.data<float>(), y.data<float>() + y.size());
}

}  // namespace llmd
