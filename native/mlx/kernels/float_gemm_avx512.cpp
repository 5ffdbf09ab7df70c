// float_gemm.h's kernel on AVX-512 (built with -mavx512f -mf16c; chosen at run time with the
// avx512vnni matmul path, as the attention kernels are). One 16-float register holds a whole
// panel row, so a 12-row x 2-panel tile keeps 24 accumulators in the 32 registers: twice the
// work per loaded value of the 8-lane kernel, which ran a SigLIP layer's matmuls at ~85% of
// the 8-lane FMA peak. Panels may hold float16 (F16 weights as stored: half the bytes to
// keep and to read, widened exactly in the register). Each output is still one FMA chain over
// k in order whatever the rows and columns around it; bias, GELU-tanh and a residual are
// applied to the finished tile before it is stored (no extra pass over the output).
#include "float_gemm_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "../simd.h"

namespace llmd::float_gemm_avx512 {

namespace {

using v16 = float __attribute__((vector_size(64)));
using v16i = int __attribute__((vector_size(64)));
constexpr int kPanel = 16;
constexpr int kRowTile = 12;

template <bool Half>
[[gnu::always_inline]] inline __m512 panel_row(const void* panel, size_t kk) {
  if constexpr (Half) {
    const auto* h = static_cast<const uint16_t*>(panel) + kk * kPanel;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(panel) + kk * kPanel);
  }
}

// Columns [c0, c0 + cols) of one finished row: + bias, GELU-tanh, + residual, stored.
[[gnu::always_inline]] inline void finish(__m512 acc, const Epilogue& e, int row, int c0, int cols, float* out,
                                          int ldo) {
  const __mmask16 m = cols >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1);
  v16 v = (v16)acc;
  if (e.bias) v += (v16)_mm512_maskz_loadu_ps(m, e.bias + c0);
  if (e.gelu_tanh) v = simd::gelu_tanh_n<v16, v16i>(v);
  const size_t at = static_cast<size_t>(row) * ldo + c0;
  if (e.residual) v = (v16)_mm512_maskz_loadu_ps(m, e.residual + at) + v;
  _mm512_mask_storeu_ps(out + at, m, (__m512)v);
}

// Rows [0, R) of x against NP (1 or 2) panels starting at column c0.
template <int R, int NP, bool Half>
[[gnu::always_inline]] inline void tile(const float* x, int k, const void* p0, const void* p1, int r0, int c0, int n,
                                        const Epilogue& e, float* out) {
  __m512 acc[R][NP];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int kk = 0; kk < k; ++kk) {
    const __m512 b0 = panel_row<Half>(p0, kk);
    const __m512 b1 = NP == 2 ? panel_row<Half>(p1, kk) : b0;
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[static_cast<size_t>(r) * k + kk]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      if constexpr (NP == 2) acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NP; ++j) {
      const int c = c0 + j * kPanel;
      finish(acc[r][j], e, r0 + r, c, std::min(kPanel, n - c), out, n);
    }
  }
}

template <int NP, bool Half>
void rows_tail(int rows, const float* x, int k, const void* p0, const void* p1, int r0, int c0, int n,
               const Epilogue& e, float* out) {
  switch (rows) {
    case 11: return tile<11, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 10: return tile<10, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 9: return tile<9, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 8: return tile<8, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 7: return tile<7, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 6: return tile<6, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 5: return tile<5, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 4: return tile<4, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 3: return tile<3, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 2: return tile<2, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    case 1: return tile<1, NP, Half>(x, k, p0, p1, r0, c0, n, e, out);
    default: return;
  }
}

template <bool Half>
void run(const float* x, int rows, int k, const void* panels, int n, int p0, int p1, float* out, const Epilogue& e) {
  const size_t panel_elems = static_cast<size_t>(k) * kPanel;
  auto panel = [&](int p) {
    return static_cast<const void*>(static_cast<const char*>(panels) + p * panel_elems * (Half ? 2 : 4));
  };
  // Rows in chunks whose activations stay in L2 (~512 KiB) while the panels pass over them.
  const int chunk = std::max(kRowTile, (128 * 1024 / std::max(k, 1)) / kRowTile * kRowTile);
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int r1 = std::min(rows, r0 + chunk);
    for (int p = p0; p < p1; p += 2) {
      const bool two = p + 1 < p1;
      const void* a = panel(p);
      const void* b = two ? panel(p + 1) : a;
      const int c0 = p * kPanel;
      int r = r0;
      for (; r + kRowTile <= r1; r += kRowTile) {
        const float* xr = x + static_cast<size_t>(r) * k;
        if (two) {
          tile<kRowTile, 2, Half>(xr, k, a, b, r, c0, n, e, out);
        } else {
          tile<kRowTile, 1, Half>(xr, k, a, b, r, c0, n, e, out);
        }
      }
      const float* xr = x + static_cast<size_t>(r) * k;
      if (two) {
        rows_tail<2, Half>(r1 - r, xr, k, a, b, r, c0, n, e, out);
      } else {
        rows_tail<1, Half>(r1 - r, xr, k, a, b, r, c0, n, e, out);
      }
    }
  }
}

}  // namespace

void gemm_panels(const float* x, int rows, int k, const void* panels, bool half, int n, int p0, int p1, float* out,
                 const Epilogue& e) {
  if (half) {
    run<true>(x, rows, k, panels, n, p0, p1, out, e);
  } else {
    run<false>(x, rows, k, panels, n, p0, p1, out, e);
  }
}

}  // namespace llmd::float_gemm_avx512
