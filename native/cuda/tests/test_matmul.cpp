// GPU tests of matmul.h against a CPU reference computed in double from core's dequantize_row of the very bytes
// uploaded (so a wrong re-layout, scale decode or nibble order shows), over every format, the GEMV row counts
// {1, 2, 3, 8, 9, 12, 17, 24, 32} (9..32 of quantized formats: the tensor-core path, matmul_mma.cu, unless
// LLMD_CUDA_MMA=0) and the prefill ones {33, 100, 512}, every epilogue, ldy > rows, stacked uploads,
// gather_rows and the prologue. Outputs are poisoned with NaN before every run and every element is checked
// (the ldy padding must stay NaN). One line per matrix and epilogue gives each row count's relative error; a
// failing case also prints its first bad element.
//
// Tolerances (relative error ||got - ref|| / ||ref||):
//  - integer-dot GEMV (q8 activations): each activation is rounded to 1/254 of its block's max |x|, uniform, so
//    the activations' relative RMS error is about (amax / 254) / sqrt(3) / rms(x); for normal data amax over 32
//    values is ~2.1 rms, giving ~0.5%; with random weights the output's relative error is the activations' (the
//    errors are independent of W): ~0.5%, limit 1.5e-2 (3e-2 for SwiGLU, which multiplies two such outputs);
//  - F16 weights in the GEMV (float32 activations, float accumulation): ~1e-6, limit 1e-4; for types converted
//    to float16 at upload (F32, Q4_1) the weights' float16 rounding (2^-11 relative, RMS ~2.8e-4) adds: 2e-3;
//  - prefill (float16 activations and weights in cuBLAS, float32 accumulation): both roundings, ~4e-4: 3e-3.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda/matmul.h"
#include "cuda/matmul_internal.h"
#include "cuda_test.h"
#include "matmul_test_util.h"

namespace llmd::cuda::testing {
namespace {

constexpr int kMaxRows = 512;
constexpr int kMaxCols = 14336;

template <class T>
DeviceBuffer to_dev(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  LLMD_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Random activations for one column count: the raw rows, the norm weight, and the normed rows in double (the
// reference's input), plus the device Activations the prologue filled from them (kMaxRows rows).
struct ActSet {
  int cols = 0;
  std::vector<float> x, norm;
  std::vector<double> normed;  // [kMaxRows][cols]
};

ActSet make_acts(int cols) {
  ActSet a;
  a.cols = cols;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  a.x.resize(size_t(kMaxRows) * cols);
  for (auto& v : a.x) v = nd(rng()) * 2.0f + 0.1f;
  a.norm.resize(cols);
  for (auto& v : a.norm) v = ud(rng());
  a.normed.resize(a.x.size());
  for (int r = 0; r < kMaxRows; ++r) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += double(a.x[size_t(r) * cols + c]) * a.x[size_t(r) * cols + c];
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
    for (int c = 0; c < cols; ++c) a.normed[size_t(r) * cols + c] = a.x[size_t(r) * cols + c] * inv * a.norm[c];
  }
  return a;
}

// Runs the prologue with the norm over kMaxRows rows into `acts`.
void fill_acts(const ActSet& a, Activations& acts) {
  DeviceBuffer x = to_dev(a.x), nw = to_dev(a.norm);
  rmsnorm_quantize(x.as<float>(), a.cols, nw.as<float>(), 1e-5f, kMaxRows, a.cols, acts, nullptr);
  LLMD_CUDA_CHECK(cudaDeviceSynchronize());
}

// ref[r][i] = sum_c w[i][c] * normed[r][c] for r < nrows.
std::vector<double> reference(const std::vector<float>& w, int rows, int cols, const ActSet& a, int nrows) {
  std::vector<double> ref(size_t(nrows) * rows);
  for (int r = 0; r < nrows; ++r) {
    const double* x = &a.normed[size_t(r) * cols];
    for (int i = 0; i < rows; ++i) {
      const float* wr = &w[size_t(i) * cols];
      double s = 0;
      for (int c = 0; c < cols; ++c) s += wr[c] * x[c];
      ref[size_t(r) * rows + i] = s;
    }
  }
  return ref;
}

const char* epi_name(Epilogue e) { return e == Epilogue::Store ? "store" : e == Epilogue::Add ? "add" : "swiglu"; }

// Counts failures over a whole test so one run reports every bad case before the test fails.
struct Failures {
  int count = 0;
  std::string first;
  void add(const std::string& what) {
    ++count;
    std::printf("    MISMATCH %s\n", what.c_str());
    if (first.empty()) first = what;
  }
  void check() const { LLMD_EXPECT(count == 0, count << " bad case(s), first: " << first); }
};

// Runs matmul for n rows and `epi`, checks every output element against ref (ref rows = w rows), returns the
// relative error (infinity on an unwritten or overwritten element).
double run_case(MatmulContext& ctx, const DeviceMatrix& dm, Activations& acts, const std::vector<double>& ref,
                int n, Epilogue epi, double tol, const std::string& label, Failures& fails) {
  const int R = dm.rows;
  const int out_rows = epi == Epilogue::SwiGLU ? R / 2 : R;
  const int ldy = out_rows + 5;  // ldy > rows: the padding must stay NaN
  std::vector<float> y0(size_t(n) * ldy, std::numeric_limits<float>::quiet_NaN());
  std::vector<double> expect(size_t(n) * out_rows);
  double ref_rms = 0;
  for (size_t i = 0; i < size_t(n) * R; ++i) ref_rms += ref[i] * ref[i];
  ref_rms = std::sqrt(ref_rms / (double(n) * R)) + 1e-30;
  std::normal_distribution<double> nd(0.0, ref_rms);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < out_rows; ++i) {
      const double* rr = &ref[size_t(r) * R];
      double e = rr[i];
      if (epi == Epilogue::Add) {
        const float v = float(nd(rng()));
        y0[size_t(r) * ldy + i] = v;
        e += v;
      } else if (epi == Epilogue::SwiGLU) {
        e = rr[i] / (1.0 + std::exp(-rr[i])) * rr[i + out_rows];
      }
      expect[size_t(r) * out_rows + i] = e;
    }
  DeviceBuffer y = to_dev(y0);
  acts.rows = n;
  matmul(ctx, dm, acts, y.as<float>(), ldy, epi, nullptr);
  LLMD_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = to_host<float>(y, y0.size());
  double num = 0, den = 0, erms = 0;
  for (double e : expect) erms += e * e;
  erms = std::sqrt(erms / expect.size()) + 1e-30;
  long bad = -1;
  bool pad_bad = false;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < ldy; ++i) {
      const float g = got[size_t(r) * ldy + i];
      if (i >= out_rows) {
        if (!std::isnan(g) && !pad_bad) {
          pad_bad = true;
          fails.add(label + " n=" + std::to_string(n) + " " + epi_name(epi) + ": ldy padding overwritten at row " +
                    std::to_string(r) + " col " + std::to_string(i));
        }
        continue;
      }
      const double e = expect[size_t(r) * out_rows + i];
      const double d = double(g) - e;
      if (!std::isfinite(g)) num = INFINITY;
      num += d * d;
      den += e * e;
      if (bad < 0 && (!std::isfinite(g) || std::fabs(d) > 10 * tol * erms)) bad = long(r) * ldy + i;
    }
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1));
  if (!(rel < tol) || bad >= 0) {
    char buf[400];
    const long r = bad >= 0 ? bad / ldy : -1, i = bad >= 0 ? bad % ldy : -1;
    std::snprintf(buf, sizeof buf, "%s n=%d %s path=%s: rel err %.3e (tol %.1e); first bad [row %ld][%ld]: got %.6g "
                  "expected %.6g",
                  label.c_str(), n, epi_name(epi), matmul_path(dm, n), rel, tol, r, i,
                  bad >= 0 ? got[bad] : 0.0, bad >= 0 ? expect[size_t(r) * out_rows + i] : 0.0);
    fails.add(buf);
  }
  return rel;
}

bool is_dp4a(WeightFormat f) { return f != WeightFormat::F16; }

double gemv_tol(const HostMatrix& h, const DeviceMatrix& d) {
  if (is_dp4a(d.format)) return 1.5e-2;
  return (h.mlx_bits == 0 && (h.type == TensorType::F16 || h.type == TensorType::BF16)) ? 1e-4 : 2e-3;
}

// Every row count and epilogue for one matrix; `counts` are the activation rows.
void check_matrix(MatmulContext& ctx, const HostMatrix& h, Activations& acts, const ActSet& a,
                  const std::vector<int>& counts, bool prefill, Failures& fails) {
  const DeviceMatrix dm = h.upload();
  const int nmax = *std::max_element(counts.begin(), counts.end());
  const std::vector<double> ref = reference(h.dequant(), h.rows, h.cols, a, nmax);
  const std::string label = h.name + " " + std::to_string(h.rows) + "x" + std::to_string(h.cols) + " (" +
                            format_name(dm.format) + ")";
  for (Epilogue epi : {Epilogue::Store, Epilogue::Add, Epilogue::SwiGLU}) {
    if (epi == Epilogue::SwiGLU && h.rows % 2 != 0) continue;
    double tol = prefill ? 3e-3 : gemv_tol(h, dm);
    if (epi == Epilogue::SwiGLU) tol *= 2;
    std::string line;
    for (int n : counts) {
      const double rel = run_case(ctx, dm, acts, ref, n, epi, tol, label, fails);
      char buf[48];
      std::snprintf(buf, sizeof buf, " %d:%.2e", n, rel);
      line += buf;
    }
    std::string paths = matmul_path(dm, counts.front());
    if (paths != matmul_path(dm, counts.back())) paths += std::string("|") + matmul_path(dm, counts.back());
    std::printf("  %-34s %-6s %-44s%s\n", label.c_str(), epi_name(epi), paths.c_str(), line.c_str());
  }
  std::fflush(stdout);
}

struct Source {
  TensorType type;
  int mlx_bits;
  int group;
};
std::vector<Source> all_sources() {
  std::vector<Source> s;
  for (TensorType t : {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K,
                       TensorType::F16, TensorType::BF16, TensorType::F32, TensorType::Q4_1, TensorType::IQ4_NL})
    s.push_back({t, 0, 0});
  for (int bits : {4, 8})
    for (int g : {32, 64, 128}) s.push_back({TensorType::F16, bits, g});
  return s;
}
bool fits(const Source& s, int cols) {
  if (s.mlx_bits) return cols % s.group == 0;
  if (s.type == TensorType::Q4_K || s.type == TensorType::Q5_K || s.type == TensorType::Q6_K) return cols % 256 == 0;
  return true;
}
HostMatrix make(const Source& s, int rows, int cols, uint64_t seed) {
  return s.mlx_bits ? random_mlx(s.mlx_bits, s.group, rows, cols, seed) : random_gguf(s.type, rows, cols, seed);
}

struct Env {
  std::unique_ptr<MatmulContext> ctx = std::make_unique<MatmulContext>(kMaxRows, size_t(1) << 22, nullptr);
  Activations acts{kMaxRows, kMaxCols};
};

void gemv_shape(int rows, int cols, bool long_rows_subset) {
  Env env;
  const ActSet a = make_acts(cols);
  fill_acts(a, env.acts);
  Failures fails;
  uint64_t seed = uint64_t(rows) * 7919 + cols;
  for (const Source& s : all_sources()) {
    if (!fits(s, cols)) continue;
    if (long_rows_subset && s.mlx_bits == 0 &&
        (s.type == TensorType::BF16 || s.type == TensorType::F32 || s.type == TensorType::Q4_1))
      continue;
    if (long_rows_subset && s.mlx_bits && s.group != 64) continue;
    check_matrix(*env.ctx, make(s, rows, cols, ++seed), env.acts, a, {1, 2, 3, 8, 9, 12, 17, 24, 32}, false, fails);
  }
  fails.check();
}

LLMD_CUDA_TEST(matmul_gemv_1000x576) { gemv_shape(1000, 576, false); }
LLMD_CUDA_TEST(matmul_gemv_1000x1536) { gemv_shape(1000, 1536, false); }
LLMD_CUDA_TEST(matmul_gemv_77x4096) { gemv_shape(77, 4096, false); }
LLMD_CUDA_TEST(matmul_gemv_64x14336) { gemv_shape(64, 14336, true); }

void prefill_shape(int rows, int cols) {
  Env env;
  const ActSet a = make_acts(cols);
  fill_acts(a, env.acts);
  Failures fails;
  uint64_t seed = uint64_t(rows) * 104729 + cols;
  for (const Source& s : all_sources()) {
    if (!fits(s, cols)) continue;
    check_matrix(*env.ctx, make(s, rows, cols, ++seed), env.acts, a, {33, 100, 512}, true, fails);
  }
  fails.check();
}

LLMD_CUDA_TEST(matmul_prefill_144x1536) { prefill_shape(144, 1536); }
LLMD_CUDA_TEST(matmul_prefill_77x576) { prefill_shape(77, 576); }

// q|k|v-like and gate|up-like stacks: the stacked matrix must equal the parts' rows one after the other.
LLMD_CUDA_TEST(matmul_stacked) {
  Env env;
  const int cols = 1536;
  const ActSet a = make_acts(cols);
  fill_acts(a, env.acts);
  Failures fails;
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_K, TensorType::Q6_K, TensorType::Q8_0, TensorType::F32}) {
    for (const std::vector<int>& parts_rows : {std::vector<int>{96, 32, 32}, std::vector<int>{128, 128}}) {
      std::vector<HostMatrix> parts;
      HostMatrix all;
      all.type = t;
      all.cols = cols;
      std::vector<GgufPart> gp;
      for (int r : parts_rows) {
        parts.push_back(random_gguf(t, r, cols, 1000 + r + parts.size()));
        all.rows += r;
      }
      for (const auto& p : parts) {
        gp.push_back({p.gguf.data(), p.rows});
        all.gguf.insert(all.gguf.end(), p.gguf.begin(), p.gguf.end());
      }
      const DeviceMatrix dm = upload_gguf_stacked(t, gp.data(), int(gp.size()), cols);
      LLMD_EXPECT(dm.rows == all.rows && dm.cols == cols, "stacked shape " << dm.rows << "x" << dm.cols);
      const std::vector<double> ref = reference(all.dequant(), all.rows, cols, a, 100);
      const std::string label = "stacked " + type_name(t) + " " + std::to_string(parts_rows.size()) + " parts";
      std::string line;
      const bool swiglu = parts_rows.size() == 2;
      for (int n : {3, 24, 100}) {
        const bool dp = is_dp4a(dm.format) && n <= kMaxGemvBatch;
        double tol = n > kMaxGemvBatch ? 3e-3 : dp ? 1.5e-2 : 2e-3;
        if (swiglu) tol *= 2;
        const double rel = run_case(*env.ctx, dm, env.acts, ref, n, swiglu ? Epilogue::SwiGLU : Epilogue::Store, tol,
                                    label, fails);
        char buf[48];
        std::snprintf(buf, sizeof buf, " %d:%.2e", n, rel);
        line += buf;
      }
      std::printf("  %-34s %-6s%s\n", label.c_str(), swiglu ? "swiglu" : "store", line.c_str());
    }
  }
  fails.check();
}

// gather_rows: rows of every format as float32, against dequantize_row (exact for the native formats up to float
// rounding; float16 rounding for the converted ones).
LLMD_CUDA_TEST(matmul_gather_rows) {
  Failures fails;
  for (int cols : {576, 1536}) {
    for (const Source& s : all_sources()) {
      if (!fits(s, cols)) continue;
      const HostMatrix h = make(s, 300, cols, 555 + cols);
      const DeviceMatrix dm = h.upload();
      std::vector<int32_t> ids(50);
      std::uniform_int_distribution<int> ud(0, h.rows - 1);
      for (auto& i : ids) i = ud(rng());
      ids[1] = ids[0];
      ids[2] = h.rows - 1;
      DeviceBuffer dids = to_dev(ids);
      std::vector<float> poison(ids.size() * cols, std::numeric_limits<float>::quiet_NaN());
      DeviceBuffer out = to_dev(poison);
      gather_rows(dm, dids.as<int32_t>(), int(ids.size()), out.as<float>(), nullptr);
      LLMD_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = to_host<float>(out, poison.size());
      std::vector<float> ref(poison.size());
      for (size_t i = 0; i < ids.size(); ++i) h.dequant_row(ids[i], &ref[i * cols]);
      const double rel = relative_error(got.data(), ref.data(), ref.size());
      const bool converted =
          s.mlx_bits == 0 && (s.type == TensorType::F32 || s.type == TensorType::Q4_1 || s.type == TensorType::BF16);
      const double tol = converted ? 1e-3 : 1e-6;
      std::printf("  gather %-12s cols %5d (%s): rel err %.2e\n", h.name.c_str(), cols, format_name(dm.format), rel);
      if (!(rel < tol)) {
        size_t k = 0;
        while (k < ref.size() && std::fabs(got[k] - ref[k]) <= 1e-3 * std::fabs(ref[k]) + 1e-6) ++k;
        char buf[256];
        std::snprintf(buf, sizeof buf, "gather %s cols %d: rel err %.3e; first bad out[%zu][%zu] (row %d): got %.6g "
                      "expected %.6g", h.name.c_str(), cols, rel, k / cols, k % cols, ids[k / cols], got[k], ref[k]);
        fails.add(buf);
      }
    }
  }
  fails.check();
}

// The prologue: float32 output vs the double reference, and the q8 blocks (layout from matmul_internal.h) decode
// to within half a step of the float32 values, with the block sums right.
LLMD_CUDA_TEST(matmul_rmsnorm_quantize) {
  for (int cols : {576, 1536, 100}) {
    for (bool norm : {true, false}) {
      const int rows = 37;
      Activations acts(64, 2048);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      std::vector<float> x(size_t(rows) * (cols + 3)), nw(cols);
      for (auto& v : x) v = nd(rng());
      for (auto& v : nw) v = 0.5f + std::fabs(nd(rng()));
      DeviceBuffer dx = to_dev(x), dnw = to_dev(nw);
      const int ldx = cols + 3;
      rmsnorm_quantize(dx.as<float>(), ldx, norm ? dnw.as<float>() : nullptr, 1e-6f, rows, cols, acts, nullptr);
      LLMD_CUDA_CHECK(cudaDeviceSynchronize());
      LLMD_EXPECT(acts.rows == rows && acts.cols == cols, "rows/cols not set");
      std::vector<float> ref(size_t(rows) * cols);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int c = 0; c < cols; ++c) ss += double(x[r * ldx + c]) * x[r * ldx + c];
        const double inv = norm ? 1.0 / std::sqrt(ss / cols + 1e-6) : 1.0;
        for (int c = 0; c < cols; ++c) ref[r * cols + c] = float(x[r * ldx + c] * inv * (norm ? nw[c] : 1.0f));
      }
      std::vector<float> f32(ref.size());
      LLMD_CUDA_CHECK(cudaMemcpy(f32.data(), acts.f32(), f32.size() * 4, cudaMemcpyDeviceToHost));
      const double rel = relative_error(f32.data(), ref.data(), ref.size());
      const int cols32 = (cols + 31) / 32 * 32, nblk = cols32 / 32;
      std::vector<int8_t> codes(size_t(rows) * cols32);
      std::vector<float> ds(size_t(rows) * nblk * 2);
      LLMD_CUDA_CHECK(cudaMemcpy(codes.data(), acts.q8(), codes.size(), cudaMemcpyDeviceToHost));
      LLMD_CUDA_CHECK(cudaMemcpy(ds.data(),
                                 static_cast<uint8_t*>(acts.q8()) + detail::q8_ds_offset(acts.max_rows(), acts.max_cols()),
                                 ds.size() * 4, cudaMemcpyDeviceToHost));
      double worst = 0, worst_sum = 0;
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < nblk; ++b) {
          const float d = ds[(r * nblk + b) * 2], s = ds[(r * nblk + b) * 2 + 1];
          long sum = 0;
          for (int l = 0; l < 32; ++l) {
            const int c = b * 32 + l;
            const int q = codes[size_t(r) * cols32 + c];
            sum += q;
            const float v = c < cols ? f32[r * cols + c] : 0.0f;
            worst = std::max(worst, double(std::fabs(d * q - v) / (d > 0 ? d : 1.0f)));  // in steps of d
          }
          worst_sum = std::max(worst_sum, std::fabs(double(d) * sum - s) / (std::fabs(s) + d + 1e-30));
        }
      std::printf("  prologue cols %4d norm %d: f32 rel err %.2e, worst code error %.3f steps, worst sum error %.2e\n",
                  cols, int(norm), rel, worst, worst_sum);
      LLMD_EXPECT(rel < 1e-5, "prologue f32 rel err " << rel);
      LLMD_EXPECT(worst <= 0.51, "a code is " << worst << " steps off its value");
      LLMD_EXPECT(worst_sum < 1e-5, "block sum error " << worst_sum);
    }
  }
}

// The tensor-core path's weight decoders alone (matmul_mma.cu's MmaDec, float16 pairs built from the bits) against
// the prefill path's float16 dequantization (dequant32, float, rounded once): Q4_0 and Q8_0 must match bit for bit,
// the K-quants within float16 rounding of their scales and mins (max error <= 4e-3 of the matrix's max |w|), the
// formats that go through dequant32 exactly. A failure here is in a decoder, not in the mma fragments or tiling.
LLMD_CUDA_TEST(matmul_mma_decode) {
  Failures fails;
  const int rows = 96, cols = 1536;
  for (const Source& s : all_sources()) {
    if (!fits(s, cols)) continue;
    const HostMatrix h = make(s, rows, cols, 4242 + (s.mlx_bits ? s.mlx_bits * 100 + s.group : int(s.type)));
    const DeviceMatrix dm = h.upload();
    if (dm.format == WeightFormat::F16) continue;  // F16 weights stay on the GEMV
    DeviceBuffer a(size_t(rows) * cols * 2), b(size_t(rows) * cols * 2);
    detail::mma_decode_f16(dm, a.as<__half>(), nullptr);
    detail::launch_dequantize_f16(dm, b.as<__half>(), nullptr);
    LLMD_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> ga = to_host<uint16_t>(a, size_t(rows) * cols), gb = to_host<uint16_t>(b, ga.size());
    double wmax = 0, dmax = 0;
    long first = -1, differ = 0;
    for (size_t i = 0; i < ga.size(); ++i) {
      const double va = half_to_float(ga[i]), vb = half_to_float(gb[i]);
      wmax = std::max(wmax, std::fabs(vb));
      if (ga[i] != gb[i]) {
        ++differ;
        if (first < 0) first = long(i);
      }
      dmax = std::max(dmax, std::isfinite(va) ? std::fabs(va - vb) : 1e30);
    }
    const bool exact = dm.format != WeightFormat::Q4_K && dm.format != WeightFormat::Q5_K &&
                       dm.format != WeightFormat::Q6_K;
    std::printf("  mma decode %-10s (%s): %ld of %zu weights differ, max |diff| %.3e (max |w| %.3e)\n", h.name.c_str(),
                format_name(dm.format), differ, ga.size(), dmax, wmax);
    if (exact ? differ != 0 : !(dmax <= 4e-3 * wmax)) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "mma decode %s: first difference at [%ld][%ld] (block %ld, weight %ld): got %.6g "
                    "expected %.6g", h.name.c_str(), first / cols, first % cols, (first % cols) / 32, first % 32,
                    half_to_float(ga[first]), half_to_float(gb[first]));
      fails.add(buf);
    }
  }
  fails.check();
}

}  // namespace
}  // namespace llmd::cuda::testing
