// The GEMV's format readers (matmul_formats.cuh: load / prep / dot2 and dequant32) run on the CPU over the host
// layout the upload builds, against dequantize_row: it separates a wrong layout, nibble order or scale decode
// (fails here too) from a GPU-only fault (passes here, fails in test_matmul.cpp). The device intrinsics the readers
// use get scalar host versions below; this file is compiled by the host compiler, never by nvcc.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test.h"

template <class T> T __ldg(const T* p) { return *p; }
template <class T> T __ldcs(const T* p) { return *p; }
inline int __dp4a(int a, int b, int c) {
  for (int k = 0; k < 4; ++k) c += int(int8_t(a >> (8 * k))) * int(int8_t(b >> (8 * k)));
  return c;
}
inline unsigned __vsub4(unsigned a, unsigned b) {
  unsigned r = 0;
  for (int k = 0; k < 4; ++k) r |= (((a >> (8 * k)) - (b >> (8 * k))) & 0xFF) << (8 * k);
  return r;
}
#include "cuda/matmul_formats.cuh"
#include "matmul_test_util.h"

namespace llmd::cuda::testing {
namespace {

using detail::ActView;
using detail::HostLayout;
using detail::WeightView;

int failures = 0;

// `floor`: what a weight's dequant32 error is measured against besides the weight itself (types the upload
// re-quantizes to Q8_0 blocks are off by up to 1/254 of their block's largest weight, so there it is that size).
template <class F>
void check(const HostMatrix& h, const HostLayout& L, const std::vector<float>& x, int n, double floor = 1e-3) {
  const int R = L.rows, C = L.cols;
  WeightView w{L.data.data(), L.aux.data(), R, C, L.group_size};
  // q8 activations per the documented layout
  const int cols32 = (C + 31) / 32 * 32, nblk = cols32 / 32;
  std::vector<int8_t> codes(size_t(n) * cols32);
  std::vector<float2> ds(size_t(n) * nblk);
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < nblk; ++b) {
      float amax = 0;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[r * C + b * 32 + l]));
      const float d = amax / 127, inv = amax > 0 ? 127 / amax : 0;
      int sum = 0;
      for (int l = 0; l < 32; ++l) {
        const int q = std::lround(x[r * C + b * 32 + l] * inv);
        codes[r * cols32 + b * 32 + l] = q;
        sum += q;
      }
      ds[r * nblk + b] = make_float2(d, d * sum);
    }
  ActView a{reinterpret_cast<const uint8_t*>(codes.data()), ds.data(), x.data(), cols32, nblk, C, n};
  std::vector<float> deq(C), v(32);
  double num = 0, den = 0, dq_err = 0;
  for (int row = 0; row < R; row += 2) {
    const int ra = row, rb = std::min(row + 1, R - 1);
    std::vector<float> acc_a(n, 0), acc_b(n, 0);
    for (int u = 0; u < F::units(C); ++u) {
      typename F::Unit A, B;
      F::load(w, ra, u, A);
      F::load(w, rb, u, B);
      F::prep(A, u);
      F::prep(B, u);
      for (int r = 0; r < n; ++r) F::dot2(A, B, a, r, u, acc_a[r], acc_b[r]);
    }
    for (int which = 0; which < 2; ++which) {
      const int rr = which ? rb : ra;
      h.dequant_row(rr, deq.data());
      for (int r = 0; r < n; ++r) {
        double ref = 0;
        for (int c = 0; c < C; ++c) ref += double(deq[c]) * x[r * C + c];
        const double got = which ? acc_b[r] : acc_a[r];
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
      for (int b = 0; b < C / 32; ++b) {
        F::dequant32(w, rr, b, v.data());
        for (int l = 0; l < 32; ++l) dq_err = std::max(dq_err, double(std::fabs(v[l] - deq[b * 32 + l])) / (std::fabs(deq[b * 32 + l]) + floor));
      }
    }
  }
  const double rel = std::sqrt(num / den);
  const bool ok = rel < 1.5e-2 && dq_err < 1e-2;
  if (!ok) ++failures;
  std::printf("  %-4s %-12s %5dx%-5d n=%d: host gemv rel err %.3e, dequant32 max rel %.2e %s\n", ok ? "ok" : "FAIL",
              h.name.c_str(), R, C, n, rel, dq_err, ok ? "" : "<<<<<<");
}

LLMD_CUDA_TEST(matmul_host_emulation) {
  failures = 0;
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0, 1);
  for (int C : {576, 1536, 4096}) {
    const int R = 16, n = 3;
    std::vector<float> x(size_t(n) * C);
    for (auto& v : x) v = nd(g);
    for (TensorType t : {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K,
                         TensorType::F16, TensorType::BF16, TensorType::F32, TensorType::Q4_1, TensorType::IQ4_NL,
                         TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K, TensorType::Q3_K}) {
      const bool k = t == TensorType::Q4_K || t == TensorType::Q5_K || t == TensorType::Q6_K ||
                     t == TensorType::Q2_K || t == TensorType::Q3_K;
      if (k && C % 256) continue;
      // Q5_1, Q2_K and Q3_K are re-quantized to Q8_0 blocks by the upload (Q5_0 is one exactly).
      const bool requantized = t == TensorType::Q5_1 || t == TensorType::Q2_K || t == TensorType::Q3_K;
      const HostMatrix h = random_gguf(t, R, C, 3 + C);
      GgufPart p{h.gguf.data(), R};
      HostLayout L = detail::layout_gguf(t, &p, 1, C);
      detail::dispatch_format(L.format, [&]<class F>() { check<F>(h, L, x, n, requantized ? 0.5 : 1e-3); });
    }
    for (int bits : {4, 8})
      for (int gs : {32, 64, 128}) {
        if (C % gs) continue;
        const HostMatrix h = random_mlx(bits, gs, R, C, 11 + C);
        HostLayout L = detail::layout_mlx_affine(bits, gs, h.mlx_w.data(), h.mlx_scales.data(), h.mlx_biases.data(), R, C);
        detail::dispatch_format(L.format, [&]<class F>() { check<F>(h, L, x, n); });
      }
  }
  LLMD_EXPECT(failures == 0, failures << " format(s) wrong in the host emulation");
}

}  // namespace
}  // namespace llmd::cuda::testing
