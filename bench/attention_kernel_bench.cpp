// Times llmd's CPU attention kernel alone (the prefill tiles PagedAttention hands it), one
// thread, float16 KV in the pool's block layout, and hashes the outputs so a changed kernel can
// be checked bit for bit against the old one. Why a separate binary: rebuilding the extension
// takes minutes, this compiles in seconds and runs exactly the kernel the engine's table holds
// (attention_<isa>.cpp included the way the build compiles it).
//
// Build (the AVX-512 variant; -DAB_AVX2 with -mavx2 -mfma -mf16c for the AVX2 one):
//   g++ -O3 -std=gnu++20 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -Inative \
//       bench/attention_kernel_bench.cpp -o /tmp/attention_kernel_bench
// Run: /tmp/attention_kernel_bench 4096 512 4 64 5
//   (context length, the chunk of rows that ends there, query heads per KV group, head size,
//    reps: prints the best GMAC/s and the FNV-1a hash of the outputs)
#if defined(AB_AVX2)
#include "mlx/kernels/attention_avx2.cpp"
namespace variant = llmd::attention::avx2;
#else
#include "mlx/kernels/attention_avx512.cpp"
namespace variant = llmd::attention::avx512;
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s context rows heads_per_group head_dim reps\n", argv[0]);
    return 2;
  }
  const int ctx = std::atoi(argv[1]), rows = std::atoi(argv[2]), group = std::atoi(argv[3]);
  const int hd = std::atoi(argv[4]), reps = std::atoi(argv[5]);
  constexpr int BT = llmd::KvPool::kBlockTokens;
  const int nb = (ctx + BT - 1) / BT;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  const llmd::AttentionKernels& ak = *variant::kernels();
  // One KV group's blocks: keys [hd][BT], values [BT][hd], as float16.
  std::vector<uint16_t> keys(static_cast<size_t>(nb) * BT * hd), values(keys.size());
  std::vector<float> x(hd);
  for (int j = 0; j < nb * BT; ++j) {
    std::vector<uint16_t> h(hd);
    for (auto& v : x) v = normal(rng);
    ak.floats_to_halves(x.data(), h.data(), hd);
    for (int d = 0; d < hd; ++d) keys[(static_cast<size_t>(j / BT) * hd + d) * BT + j % BT] = h[d];
    for (auto& v : x) v = normal(rng);
    ak.floats_to_halves(x.data(), values.data() + static_cast<size_t>(j) * hd, hd);
  }
  std::vector<const void*> kb(nb), vb(nb);
  for (int b = 0; b < nb; ++b) {
    kb[b] = keys.data() + static_cast<size_t>(b) * BT * hd;
    vb[b] = values.data() + static_cast<size_t>(b) * BT * hd;
  }
  // The chunk's rows end at the context's last position; queries pre-scaled as the engine does.
  std::vector<float> qs(static_cast<size_t>(rows) * group * hd), out(qs.size());
  for (auto& v : qs) v = normal(rng) / std::sqrt(static_cast<float>(hd));
  std::vector<float> scratch(llmd::attention_scratch_floats(hd));
  const int rows_per_tile = std::max(1, llmd::kMaxTileRows / group);
  double macs = 0;
  for (int r = 0; r < rows; ++r) macs += 2.0 * hd * group * (ctx - rows + r + 1);
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r0 = 0; r0 < rows; r0 += rows_per_tile) {
      llmd::AttentionTile at;
      at.rows = std::min(rows_per_tile, rows - r0) * group;
      for (int i = 0; i < at.rows; ++i) {
        const int row = r0 + i / group;
        at.q[i] = qs.data() + (static_cast<size_t>(row) * group + i % group) * hd;
        at.out[i] = out.data() + (static_cast<size_t>(row) * group + i % group) * hd;
        at.n_pos[i] = ctx - rows + row + 1;
        at.first_pos[i] = 0;
      }
      ak.attend_f16(at, kb.data(), vb.data(), hd, BT, scratch.data());
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  uint64_t hash = 1469598103934665603ull;
  for (float v : out) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    hash = (hash ^ bits) * 1099511628211ull;
  }
  std::printf("%s: ctx %d rows %d group %d hd %d: %.3f ms, %.1f GMAC/s, hash %016llx\n", ak.isa, ctx, rows, group, hd,
              best * 1e3, macs / best / 1e9, static_cast<unsigned long long>(hash));
  return 0;
}
