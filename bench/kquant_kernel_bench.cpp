// Times llmd's packed K-quant (and Q8_0, Q4_0; row-major Q2_K, Q3_K) GEMM kernels alone, one thread, weights packed once (excluded from
// the time), activations quantized once. Why a separate binary: rebuilding the extension takes
// 15+ minutes on a shared 2-core box, this compiles in seconds of CPU, and it times exactly the
// kernel functions the engine calls (qgemm_impl.h included the way qgemm_<isa>.cpp includes it).
//
// Build (AVX-512 VNNI path; add -DKB_AVX2 and drop the avx512 flags for the AVX2 path):
//   g++ -O3 -std=gnu++20 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni \
//       -Inative bench/kquant_kernel_bench.cpp native/mlx/kernels/pack8.cpp \
//       native/core/tensor_types.cpp -o /tmp/kquant_kernel_bench
// Run: /tmp/kquant_kernel_bench q5k 512 2048 2048 20   (type rows n k reps; prints best GMAC/s)
// The AVX-512 build times the function the engine's table holds (the register-blocked prefill
// kernels of kquant_zmm_blocked.h) and checks its outputs bit for bit against the 8-column
// kernels one row at a time (decode); a 6th argument `x8` times the 8-column kernels instead.
#define LLMD_ISA_X86 1
#if defined(KB_AVX2)
#define LLMD_ISA_NAMESPACE avx2
#define KB_ISA_NAME "avx2"
#else
#define LLMD_ISA_VNNI 1
#define LLMD_ISA_NAMESPACE avx512vnni
#define KB_ISA_NAME "avx512vnni"
#endif
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mlx/kernels/qgemm_impl.h"

namespace isa = llmd::kernels::LLMD_ISA_NAMESPACE;
using llmd::TensorType;
using llmd::kernels::ActBlock;

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: %s q2k|q3k|q4k|q5k|q6k|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl rows n k reps [x8]\n", argv[0]);
    return 2;
  }
  const std::string ty = argv[1];
  const int rows = std::atoi(argv[2]), n = std::atoi(argv[3]), k = std::atoi(argv[4]), reps = std::atoi(argv[5]);
  const TensorType tt = ty == "q2k"    ? TensorType::Q2_K
                        : ty == "q3k"  ? TensorType::Q3_K
                        : ty == "q5k"  ? TensorType::Q5_K
                        : ty == "q6k"  ? TensorType::Q6_K
                        : ty == "q8_0" ? TensorType::Q8_0
                        : ty == "q4_0" ? TensorType::Q4_0
                        : ty == "q4_1" ? TensorType::Q4_1
                        : ty == "iq4_nl" ? TensorType::IQ4_NL
                        : ty == "q5_0" ? TensorType::Q5_0
                        : ty == "q5_1" ? TensorType::Q5_1
                                       : TensorType::Q4_K;
  const size_t rb = llmd::row_bytes(tt, k);
  const bool row_major = tt == TensorType::Q2_K || tt == TensorType::Q3_K;  // no packed layout
  const int block_bytes = tt == TensorType::Q2_K   ? 84
                          : tt == TensorType::Q3_K ? 110
                          : tt == TensorType::Q6_K ? 210
                          : tt == TensorType::Q5_K ? 176
                          : tt == TensorType::Q8_0 ? 34
                          : tt == TensorType::Q4_0 || tt == TensorType::IQ4_NL ? 18
                          : tt == TensorType::Q4_1 ? 20
                          : tt == TensorType::Q5_0 ? 22
                          : tt == TensorType::Q5_1 ? 24
                                                   : 144;
  std::vector<uint8_t> w(rb * n);
  std::mt19937 rng(1);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  // Random bytes except the fp16 scales, kept finite and small (timing does not depend on them).
  for (size_t o = 0; o < w.size(); o += block_bytes) {
    const uint16_t h = static_cast<uint16_t>(0x2000 + (rng() & 0x3ff));
    const int at = tt == TensorType::Q6_K ? 208 : tt == TensorType::Q2_K ? 80 : tt == TensorType::Q3_K ? 108 : 0;
    std::memcpy(&w[o + at], &h, 2);
    if (tt == TensorType::Q2_K) std::memcpy(&w[o + 82], &h, 2);
    if (tt == TensorType::Q4_K || tt == TensorType::Q5_K || tt == TensorType::Q4_1 || tt == TensorType::Q5_1) {
      std::memcpy(&w[o + 2], &h, 2);
    }
  }
  std::vector<float> x(static_cast<size_t>(rows) * k);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = normal(rng);
  const int nb = k / llmd::kernels::kBlock;
  std::vector<ActBlock> act(static_cast<size_t>(rows) * nb);
  // As uses_superblock_activations (dispatch.cpp, not linked here): the K-quants per 256.
  const bool per256 = row_major || tt == TensorType::Q4_K || tt == TensorType::Q5_K || tt == TensorType::Q6_K;
  const auto quantize = per256 ? isa::quantize_row_k_simd : isa::quantize_row_simd;
  for (int r = 0; r < rows; ++r) quantize(x.data() + static_cast<size_t>(r) * k, act.data() + static_cast<size_t>(r) * nb, k);
#if defined(KB_AVX2)
  constexpr auto layout = llmd::kernels::PackLayout::kDword;
#else
  constexpr auto layout = llmd::kernels::PackLayout::kQword;
#endif
  if (!row_major) llmd::kernels::pack8_in_place(tt, w.data(), n, k, layout);
  // The functions make_table puts in each path's KernelTable (qgemm_impl.h); `x8` times the
  // 8-column kernels the AVX-512 table used before the register-blocked ones.
#if defined(KB_AVX2)
  auto x8 = tt == TensorType::Q5_K   ? isa::gemm_q5_k_x8
                  : tt == TensorType::Q6_K ? isa::gemm_q6_k_x8
                  : tt == TensorType::Q8_0 ? isa::gemm_q8_0_x8
                  : tt == TensorType::Q4_0 ? isa::gemm_q4_0_x8
                  : tt == TensorType::Q4_1 ? isa::gemm_q4_1_x8
                  : tt == TensorType::IQ4_NL ? isa::gemm_iq4_nl_x8
                  : tt == TensorType::Q5_0 ? isa::gemm_q5_0_x8
                  : tt == TensorType::Q5_1 ? isa::gemm_q5_1_x8
                                           : isa::gemm_q4_k_x8;
  auto gemm = tt == TensorType::Q5_K   ? isa::gemm_q5_k_x8_expanded
                    : tt == TensorType::Q6_K ? isa::gemm_q6_k_x8_expanded
                    : tt == TensorType::Q8_0 ? isa::gemm_q8_0_x8
                    : tt == TensorType::Q4_0 ? isa::gemm_q4_0_x8
                    : tt == TensorType::Q4_1 ? isa::gemm_q4_1_x8
                    : tt == TensorType::IQ4_NL ? isa::gemm_iq4_nl_x8_expanded
                    : tt == TensorType::Q5_0 ? isa::gemm_q5_0_x8
                    : tt == TensorType::Q5_1 ? isa::gemm_q5_1_x8
                                             : isa::gemm_q4_k_x8_expanded;
#else
  auto x8 = tt == TensorType::Q5_K   ? isa::gemm_q5_k_x8
                  : tt == TensorType::Q6_K ? isa::gemm_q6_k_x8
                  : tt == TensorType::Q8_0 ? isa::gemm_q8_0_x8_zmm
                  : tt == TensorType::Q4_0 ? isa::gemm_q4_0_x8_zmm
                  : tt == TensorType::Q4_1 ? isa::gemm_q4_1_x8_zmm
                  : tt == TensorType::IQ4_NL ? isa::gemm_iq4_nl_x8_zmm
                  : tt == TensorType::Q5_0 ? isa::gemm_q5_0_x8_zmm
                  : tt == TensorType::Q5_1 ? isa::gemm_q5_1_x8_zmm
                                           : isa::gemm_q4_k_x8;
  const bool old = argc == 7 && std::string(argv[6]) == "x8";
  const auto blocked = tt == TensorType::Q5_K   ? isa::gemm_q5_k_x8_blocked
                       : tt == TensorType::Q6_K ? isa::gemm_q6_k_x8_blocked
                       : tt == TensorType::Q8_0 ? isa::gemm_q8_0_x8_zmm
                       : tt == TensorType::Q4_0 ? isa::gemm_q4_0_x8_zmm
                       : tt == TensorType::Q4_1 ? isa::gemm_q4_1_x8_zmm
                       : tt == TensorType::IQ4_NL ? isa::gemm_iq4_nl_x8_zmm
                       : tt == TensorType::Q5_0 ? isa::gemm_q5_0_x8_zmm
                       : tt == TensorType::Q5_1 ? isa::gemm_q5_1_x8_zmm
                                                : isa::gemm_q4_k_x8_blocked;
  auto gemm = old ? x8 : blocked;
#endif
  if (row_major) {
    x8 = tt == TensorType::Q2_K ? isa::gemm_q2_k : isa::gemm_q3_k;
#if defined(KB_AVX2)
    gemm = tt == TensorType::Q2_K ? isa::gemm_q2_k_expanded : isa::gemm_q3_k_expanded;
#else
    gemm = tt == TensorType::Q2_K ? isa::gemm_q2_k_blocked : isa::gemm_q3_k_blocked;
#endif
  }
  std::vector<float> out(static_cast<size_t>(rows) * n);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(w.data(), rb, act.data(), k, rows, 0, n, out.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double checksum = 0;
  uint64_t bits = 1469598103934665603ull;  // FNV-1a of the outputs' bytes: equal only if bit-identical
  for (float v : out) {
    checksum += v;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    bits = (bits ^ u) * 1099511628211ull;
  }
  // Each row alone through the one-row (decode) kernel: the prefill outputs must be the same bits.
  int differ = 0;
  std::vector<float> one(n);
  for (int r = 0; r < rows; ++r) {
    x8(w.data(), rb, act.data() + static_cast<size_t>(r) * nb, k, 1, 0, n, one.data(), n);
    differ += std::memcmp(one.data(), out.data() + static_cast<size_t>(r) * n, n * sizeof(float)) != 0;
  }
  if (differ) std::printf("MISMATCH: %d of %d rows differ from the one-row kernel\n", differ, rows);
  std::printf("%s %s %d x %d x %d: best %.3f ms, %.1f GMAC/s (checksum %.6g, bits %016llx)\n", argv[1],
              KB_ISA_NAME, rows, n, k, best * 1e3, static_cast<double>(rows) * n * k / best / 1e9, checksum,
              static_cast<unsigned long long>(bits));
  return 0;
}
