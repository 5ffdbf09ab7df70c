// Q4_0, Q4_1, IQ4_NL and Q8_0 on 512-bit vectors (AVX-512 VNNI path), over their kQword tiles
// (pack8.h).
// Included by qgemm_impl.h after kquant_impl.h, whose pair machinery (KqPair, KqPairRows,
// broadcast_pair) these kernels share.
//
// Why: the 256-bit packed kernels spend, per 32-element block and row, one int->float
// conversion, two multiplies and two FMAs (Q4_0's -8 offset is a float term) on 8 dpbusd of
// 32 lanes. Here a 64-byte slice holds 8 columns x (4 bytes of block 2p, 4 of block 2p + 1),
// one vpdpbusd against a broadcast activation qword sums both blocks in separate lanes, and the
// offsets (Q4_0: q - 8; Q8_0: weights stored as q + 128, the unsigned operand) are integer seeds
// of the chains (-8 / -128 * sum(a), computed once per call): one conversion, multiply and FMA
// per row serve two blocks. One Zen 5 core, 256 x 2048 x 2048, weights packed once (a throwaway
// harness over KernelTable::packed_gemm_for): Q4_0 183 -> 319 GMAC/s, Q8_0 149 -> 303.
// IQ4_NL is Q4_0's tile with each nibble looked up (vpshufb) into its level + 128, the unsigned
// operand, under Q8_0's -128 * sum(a) seed. Q4_1 (d * q + m) is Q4_0's tile with unseeded chains
// and its minimum as one more FMA per row and pair: m * (d_a * sum(a)), the activation's s.
// Q5_0 / Q5_1 are Q4_0's / Q4_1's tiles plus the codes' fifth bits, 64-bit masks that one masked
// byte add per nibble half applies to a slice (as Q5_K's); Q5_0's q - 16 seeds the chains.
#pragma once

#if defined(LLMD_ISA_VNNI)

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

// Tiles of a pair of blocks ahead that a streaming call (decode, the first row tile of a chunk)
// asks for: about 10 KiB. One tile of 8 rows takes ~25 ns to compute, so the ~1 KiB ahead these
// kernels first asked for arrived after the tile was wanted, and an 8-row product out of DRAM
// cost about its compute plus its streaming. One Zen 4 core, 8 x 16384 x 4096 from DRAM (the
// noisy host's bandwidth), alternating builds: Q4_1 8 rows 96.7-97.0 -> 105-112 GMAC/s; two cores
// at once (summed) 1 row 24.7-26.8 -> 28.3-33.1, 8 rows 116-128 -> 120-137; Q4_0 1 row 28.9-30.3
// -> 31.6-33.2; Q8_0 1 row 16.5-17.7 -> 17.7-19.0 (its tiles are 1.7x larger: half the pairs).
// The block types of this file: Q8_0's bytes, or 4-bit codes standing for q - 8 (Q4_0), for
// q plus a minimum (Q4_1) or for IQ4_NL's levels.
enum class Legacy { kQ4_0, kQ4_1, kIq4nl, kQ8_0, kQ5_0, kQ5_1 };

template <Legacy kType>
constexpr int kLegacyPrefetchPairs = kType == Legacy::kQ8_0 ? 16 : 32;

// Lane 2c (2c + 1): column c's exact integer dot with block 2p (2p + 1), the chain seeded with
// the offset term; then acc = fma(float(isum), d_w * d_a, acc) in that lane, and
// out = acc[2c] + acc[2c + 1] at the end. The same operations in the same order for every row
// count R, so an output does not depend on the tile it fell in.
template <int R, Legacy kType>
inline void dot8_legacy_zmm(const uint8_t* w, const KqPair* const* a, int nb, float* const* out, bool stream) {
  constexpr bool kQ8 = kType == Legacy::kQ8_0;
  constexpr bool kMin = kType == Legacy::kQ4_1 || kType == Legacy::kQ5_1;
  constexpr bool kFive = kType == Legacy::kQ5_0 || kType == Legacy::kQ5_1;
  constexpr int kTile = kQ8 ? 8 * 68 : 8 * (kMin ? 40 : 36) + (kFive ? 64 : 0);  // two GGUF blocks of 8 rows
  constexpr int kQuants = kMin ? 64 : 32;  // the scale fields' bytes
  constexpr int kSlices = kQ8 ? 8 : 4;
  const __m512i sixteen = _mm512_set1_epi8(0x10);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i levels = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4nlValuesU8)));
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int p = 0; p < nb / 2; ++p) {
    if (stream) prefetch_tiles<1, kTile>(w, 0, p + kLegacyPrefetchPairs<kType>);
    const uint8_t* t = w + static_cast<size_t>(p) * kTile;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
    // Q4_1's minima, the pair's second scale field (read once per pair, for every row).
    const __m512 mw =
        kMin ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32))) : _mm512_setzero_ps();
    // Two chains per row (even and odd slices, or low and high nibbles), added once: more
    // independent dpbusd chains to hide its latency; integer sums are exact.
    __m512i isum[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      isum[r][0] = kMin ? _mm512_setzero_si512() : _mm512_set1_epi64(static_cast<long long>(load_u64(a[r][p].seed[0])));
      isum[r][1] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int s = 0; s < kSlices; ++s) {
      const __m512i q = _mm512_loadu_si512(t + kQuants + 64 * s);
      if constexpr (kQ8) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512i av = _mm512_set1_epi64(static_cast<long long>(load_u64(a[r][p].q + 8 * s)));
          isum[r][s & 1] = _mm512_dpbusd_epi32(isum[r][s & 1], q, av);
        }
      } else {
        __m512i lo = _mm512_and_si512(q, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if constexpr (kType == Legacy::kIq4nl) {
          lo = _mm512_shuffle_epi8(levels, lo);
          hi = _mm512_shuffle_epi8(levels, hi);
        }
        if constexpr (kFive) {
          const uint8_t* masks = t + kQuants + 256 + 16 * s;
          lo = _mm512_mask_add_epi8(lo, load_u64(masks), lo, sixteen);
          hi = _mm512_mask_add_epi8(hi, load_u64(masks + 8), hi, sixteen);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* aq = a[r][p].q + 16 * s;
          isum[r][0] = _mm512_dpbusd_epi32(isum[r][0], lo, _mm512_set1_epi64(static_cast<long long>(load_u64(aq))));
          isum[r][1] = _mm512_dpbusd_epi32(isum[r][1], hi, _mm512_set1_epi64(static_cast<long long>(load_u64(aq + 8))));
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(isum[r][0], isum[r][1]));
      acc[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(dw, broadcast_pair(a[r][p].d)), acc[r]);
      if constexpr (kMin) acc[r] = _mm512_fmadd_ps(mw, broadcast_pair(a[r][p].s), acc[r]);
    }
  }
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 sum = _mm512_add_ps(acc[r], _mm512_permute_ps(acc[r], _MM_SHUFFLE(2, 3, 0, 1)));
    _mm256_storeu_ps(out[r], _mm512_castps512_ps256(_mm512_permutexvar_ps(evens, sum)));
  }
}

// 8 rows a tile, as the K-quants' 512-bit kernels (8 accumulators and 16 chains fit AVX-512's
// 32 registers beside the weights). The activation rows carry the offset term's seed: -8 *
// sum(a) for Q4_0's q - 8, -128 * sum(a) for the levels or quants stored + 128, none for Q4_1.
template <Legacy kType>
struct Dot8LegacyZmm {
  template <int R, int G>
  struct Tile {
    static constexpr int kSingleRowGroups = 1;
    static constexpr int kRowTile = 8;
    using Rows = KqPairRows<kType == Legacy::kQ4_0                                 ? PairSeeds::kWhole8
                            : kType == Legacy::kQ5_0                               ? PairSeeds::kWhole16
                            : kType == Legacy::kQ4_1 || kType == Legacy::kQ5_1 ? PairSeeds::kNone
                                                                                   : PairSeeds::kWhole128>;
    static void run(const uint8_t* w, size_t /*stride*/, const KqPair* const* a, int nb, float* const* out,
                    bool stream) {
      static_assert(G == 1, "the 512-bit kernels take one group at a time");
      dot8_legacy_zmm<R, kType>(w, a, nb, out, stream);
    }
  };
};

// The tile a matrix was packed in follows k (pack8.h's packed_layout): pairs of blocks where k
// is a multiple of 64, the 256-bit tile (kDword's kernel) otherwise.
template <Legacy kType, GemmFn kDword>
inline void gemm_legacy_x8_zmm(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                               float* out, int ldo) {
  if (k % (2 * kBlock) != 0) return kDword(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_packed<Dot8LegacyZmm<kType>::template Tile>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline constexpr GemmFn gemm_q4_0_x8_zmm = gemm_legacy_x8_zmm<Legacy::kQ4_0, gemm_q4_0_x8>;
inline constexpr GemmFn gemm_q4_1_x8_zmm = gemm_legacy_x8_zmm<Legacy::kQ4_1, gemm_q4_1_x8>;
inline constexpr GemmFn gemm_q8_0_x8_zmm = gemm_legacy_x8_zmm<Legacy::kQ8_0, gemm_q8_0_x8>;
inline constexpr GemmFn gemm_q5_0_x8_zmm = gemm_legacy_x8_zmm<Legacy::kQ5_0, gemm_q5_0_x8>;
inline constexpr GemmFn gemm_q5_1_x8_zmm = gemm_legacy_x8_zmm<Legacy::kQ5_1, gemm_q5_1_x8>;
inline constexpr GemmFn gemm_iq4_nl_x8_zmm = gemm_legacy_x8_zmm<Legacy::kIq4nl, gemm_iq4_nl_x8>;

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE

#endif
