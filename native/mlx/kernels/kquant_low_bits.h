// Q2_K and Q3_K kernels: the bulk of llama.cpp's Q2_K and Q3_K_S / Q3_K_M / Q3_K_L recipes, run
// as stored (2.625 and 3.4375 bits per weight). Included by qgemm_impl.h inside each ISA's
// translation unit, after kquant_impl.h. Block layouts: core/low_bit_kquants.h.
//
// Why native: a pull used to convert them (Q2_K -> Q8_0, Q3_K -> Q6_K), and decode, bound by the
// bytes it reads, read 3.2x / 1.9x more of them (bench/README.md: a 1B Q2_K file decoded at
// 0.44x llama.cpp's speed).
//
// Maths per (activation row, weight row, super-block), with the activations per 256
// (quantize_row_k: one scale a.d for the super-block) and q the unsigned codes:
//   isum = sum_h s_h * dot(q_h, a_h) over the 16 sub-blocks h (exact int32)
//   Q2_K: s_h = sc_h in [0, 15]; imin = sum_h m_h * sum(a_h)
//   Q3_K: s_h = sc_h - 32;       isum -= 4 * sum_h s_h * sum(a_h)   (q - 4 = the signed value)
//   acc = step(acc, isum, d, a.d);  Q2_K also accm = step(accm, imin, dmin, a.d)
//   out = acc (- accm)
// where step is the float step of the Q6_K prefill kernel the path hands prompts to
// (kquant_low_bits_prefill.h): on AVX-512 kb6_tile's fma(float(isum) * d, a.d, acc), on AVX2
// and the portable paths dot8_q6k_x's fma(float(isum), d * a.d, acc). So a row's output does
// not depend on the rows batched with it, and the AVX2 and scalar paths agree bit for bit
// (AVX-512 rounds its step differently). Weights stay row-major (no packed tile): each weight
// super-block is unpacked once per tile of activation rows.
#pragma once

#include "../../core/low_bit_kquants.h"

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

// One activation row's super-block, arranged for the kernels: 32-byte run 2j + n holds the
// elements 128n + 32j .. +31, the ones a shift by 2j of qs half n lines up with.
struct alignas(64) LowBitsAct {
  int8_t q[kSuper];
  int16_t sums[16];  // sum of q over sub-block h (elements 16h .. 16h + 15)
  float d;           // the super-block's activation scale
};

inline void low_bits_prepare(const ActBlock* b, int nsb, LowBitsAct* out) {
  for (int sb = 0; sb < nsb; ++sb, b += kSubBlocks) {
    LowBitsAct& o = out[sb];
    for (int blk = 0; blk < kSubBlocks; ++blk) {
      const int n = blk / 4, j = blk % 4;  // block 4n + j holds elements 128n + 32j .. +31
      std::memcpy(o.q + 64 * j + 32 * n, b[blk].q, kBlock);
      for (int half = 0; half < 2; ++half) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += b[blk].q[16 * half + i];
        o.sums[2 * blk + half] = static_cast<int16_t>(s);
      }
    }
    o.d = b[0].d;
  }
}

// A super-block's float step (see the top of the file).
inline float low_bits_step(float acc, int32_t isum, float d, float ad) {
#if defined(LLMD_ISA_VNNI)
  return std::fma(static_cast<float>(isum) * d, ad, acc);
#else
  return std::fma(static_cast<float>(isum), d * ad, acc);
#endif
}

// The float steps every path takes once the integers are known.
struct LowBitsAcc {
  float acc = 0.f;
  float accm = 0.f;
  void step(int32_t isum, float d, int32_t imin, float dmin, float ad, bool has_min) {
    acc = low_bits_step(acc, isum, d, ad);
    if (has_min) accm = low_bits_step(accm, imin, dmin, ad);
  }
  float result(bool has_min) const { return has_min ? acc - accm : acc; }
};

#if defined(LLMD_ISA_X86)

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// acc += madd(p, s) (int16 pairs into int32 lanes): VNNI fuses the add.
inline __m256i madd_acc(__m256i acc, __m256i p, __m256i s) {
#if defined(LLMD_ISA_VNNI)
  return _mm256_dpwssd_epi32(acc, p, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

// A Q3_K block's 16 scales (sc - 32) as bytes: q3k_scales' unpacking in vector registers.
inline __m128i q3k_scales_simd(const uint8_t* packed) {
  const __m128i lo8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed));
  const __m128i low = _mm_and_si128(_mm_unpacklo_epi64(lo8, _mm_srli_epi16(lo8, 4)), _mm_set1_epi8(0x0f));
  // Byte 4s + i: bits 2s..2s+1 of packed[8 + i], the high bits of sub-block 4s + i.
  const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(packed + 8))),
                                                    _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(0x03));
  return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

// pshufb indices that spread a super-block's 16 scale bytes (broadcast to every 128-bit lane)
// into int16 words, one sub-block per 128-bit lane of the code vector they multiply. Q2_K's
// scales are unsigned (high byte zeroed by 0x80); Q3_K's are signed, so their byte is doubled
// and the word shifted right arithmetically.
//   512-bit: shift 2j of all 64 qs bytes, lane L: sub-block 8 (L / 2) + 2j + L % 2.
//   256-bit: shift 2j of half n, lane L: sub-block 8n + 2j + L (index 2j + n).
#if defined(LLMD_ISA_VNNI)
using LowBitsVec = __m512i;
constexpr int kLowBitsVecs = 4;  // code vectors per super-block
#else
using LowBitsVec = __m256i;
constexpr int kLowBitsVecs = 8;
#endif
constexpr int kLowBitsLanes = static_cast<int>(sizeof(LowBitsVec)) / 16;

struct LowBitsScaleIndex {
  alignas(64) int8_t b[kLowBitsVecs][sizeof(LowBitsVec)];
  explicit constexpr LowBitsScaleIndex(bool sign) : b{} {
    for (int i = 0; i < kLowBitsVecs; ++i) {
      for (int lane = 0; lane < kLowBitsLanes; ++lane) {
        const int sub = kLowBitsLanes == 4 ? 8 * (lane / 2) + 2 * i + lane % 2 : 8 * (i % 2) + 2 * (i / 2) + lane;
        for (int w = 0; w < 8; ++w) {
          b[i][16 * lane + 2 * w] = static_cast<int8_t>(sub);
          b[i][16 * lane + 2 * w + 1] = sign ? static_cast<int8_t>(sub) : static_cast<int8_t>(-128);
        }
      }
    }
  }
  LowBitsVec operator[](int i) const {
    LowBitsVec v;
    std::memcpy(&v, b[i], sizeof(v));
    return v;
  }
};
inline constexpr LowBitsScaleIndex kLowBitsIndex[2] = {LowBitsScaleIndex(false), LowBitsScaleIndex(true)};

// One weight row's super-block against R activation rows: per row the partial sums of
// s_h * dot(q_h, a_h) (lanes of isum; Q3_K with - 4 * s_h * sum(a_h) folded in) and of
// m_h * sum(a_h) (lanes of wsum, Q2_K), as 8 int32 lanes each. (d and dmin: the caller's.)
template <int R, bool kThree>
inline void low_bits_column(const uint8_t* blk, const LowBitsAct* const* a, int sb, __m256i* isum, __m256i* wsum) {
  const LowBitsScaleIndex& index = kLowBitsIndex[kThree];
  __m128i sc8;
  __m256i sum_w;  // int16 words multiplying the sub-block sums: Q2_K's mins, Q3_K's scales
  if constexpr (kThree) {
    sc8 = q3k_scales_simd(blk + 96);
    sum_w = _mm256_cvtepi8_epi16(sc8);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i m15 = _mm_set1_epi8(0x0f);
    sc8 = _mm_and_si128(raw, m15);
    sum_w = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m15));
  }
  const uint8_t* qs = blk + (kThree ? 32 : 16);
#if defined(LLMD_ISA_VNNI)
  // Both halves of qs in one register: shift 2j gives blocks j (bytes 0-31) and 4 + j.
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i scb = _mm512_broadcast_i32x4(sc8);
  const __m512i q = _mm512_loadu_si512(qs);
  __m512i hm = _mm512_setzero_si512();
  if constexpr (kThree) {
    // hmask's bits 0-3 serve the first half's shifts, bits 4-7 the second's.
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    hm = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 4), 1);
  }
  __m512i acc[R];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    __m512i wq = _mm512_and_si512(j == 0 ? q : _mm512_srli_epi16(q, 2 * j), m3);
    if constexpr (kThree) {
      const __mmask64 high = _mm512_test_epi8_mask(hm, _mm512_set1_epi8(static_cast<char>(1 << j)));
      wq = _mm512_mask_add_epi8(wq, high, wq, _mm512_set1_epi8(4));
    }
    __m512i sw = _mm512_shuffle_epi8(scb, index[j]);
    if constexpr (kThree) sw = _mm512_srai_epi16(sw, 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i p = _mm512_maddubs_epi16(wq, _mm512_load_si512(a[r][sb].q + 64 * j));
      acc[r] = j == 0 ? _mm512_madd_epi16(p, sw) : _mm512_dpwssd_epi32(acc[r], p, sw);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    isum[r] = _mm256_add_epi32(_mm512_castsi512_si256(acc[r]), _mm512_extracti64x4_epi64(acc[r], 1));
  }
#else
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i scb = _mm256_broadcastsi128_si256(sc8);
  __m256i hm = _mm256_setzero_si256();
  if constexpr (kThree) hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int n = 0; n < 2; ++n) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * n));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m256i wq = _mm256_and_si256(j == 0 ? q : _mm256_srli_epi16(q, 2 * j), m3);
      if constexpr (kThree) {
        const int bit = 4 * n + j;  // hmask bit of these codes, moved to bit 2
        const __m256i h = bit <= 2 ? _mm256_slli_epi16(hm, 2 - bit) : _mm256_srli_epi16(hm, bit - 2);
        wq = _mm256_or_si256(wq, _mm256_and_si256(h, _mm256_set1_epi8(4)));
      }
      __m256i sw = _mm256_shuffle_epi8(scb, index[2 * j + n]);
      if constexpr (kThree) sw = _mm256_srai_epi16(sw, 8);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[r][sb].q + 64 * j + 32 * n));
        isum[r] = madd_acc(isum[r], _mm256_maddubs_epi16(wq, av), sw);
      }
    }
  }
#endif
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256i sums = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[r][sb].sums));
    wsum[r] = _mm256_madd_epi16(sum_w, sums);
    if constexpr (kThree) isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(wsum[r], 2));
  }
}

// low_bits_step on lanes (d and ad per lane).
template <class F, class I>
inline F low_bits_step_v(F acc, I isum, F d, F ad) {
  if constexpr (sizeof(F) == 16) {
#if defined(LLMD_ISA_VNNI)
    return _mm_fmadd_ps(_mm_mul_ps(_mm_cvtepi32_ps(isum), d), ad, acc);
#else
    return _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(d, ad), acc);
#endif
  } else {
#if defined(LLMD_ISA_VNNI)
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), d), ad, acc);
#else
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, ad), acc);
#endif
  }
}

// The lane totals of four int32 vectors: lane c of the result sums v[c] (exact).
inline __m128i hsum4_epi32(const __m256i v[4]) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// out[r * C + c] = dot(weight row w[c], activation row r): R rows x C (1 or 4) weight rows.
// Four weight rows share one horizontal reduction and one vector of float steps (lane c takes
// LowBitsAcc::step's operations on column c, so the bits are those of C = 1). `next`, if set:
// `next_bytes` the caller reads after this call, asked for a few lines per super-block (four
// rows read side by side are four short streams, which the hardware prefetchers did not keep
// ahead of: a 1B Q2_K decode ran at half the speed of one row at a time without this).
template <int R, int C, bool kThree>
inline void dot_low_bits(const uint8_t* const* w, const LowBitsAct* const* a, int nsb, float* out,
                         const uint8_t* next = nullptr, size_t next_bytes = 0) {
  static_assert((C == 4 && R == 1) || (C == 1 && R <= 4), "one row x four weight rows, or up to four rows");
  constexpr int kBytes = kThree ? kQ3KBlockBytes : kQ2KBlockBytes;
  // Lanes: the four weight rows (C = 4) or the rows (C = 1; unused lanes sum zeros).
  __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
  const int lines = static_cast<int>((next_bytes + 63) / 64);
  const int per_sb = (lines + nsb - 1) / nsb;
  for (int sb = 0; sb < nsb; ++sb) {
    for (int l = sb * per_sb; l < std::min(lines, (sb + 1) * per_sb); ++l) __builtin_prefetch(next + 64 * l);
    __m256i isum[C][R], wsum[C][R];
    __m128i dh = _mm_setzero_si128(), dminh = _mm_setzero_si128();  // fp16 in lanes, built in registers
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w[c] + static_cast<size_t>(sb) * kBytes;
      low_bits_column<R, kThree>(blk, a, sb, isum[c], wsum[c]);
      dh = _mm_insert_epi16(dh, read_u16(blk + (kThree ? 108 : 80)), c);
      if constexpr (!kThree) dminh = _mm_insert_epi16(dminh, read_u16(blk + 82), c);
    }
    __m128 dv = _mm_cvtph_ps(dh);
    __m128 dminv = _mm_cvtph_ps(dminh);
    __m256i is[4], ws[4];
    __m128 adv;
    if constexpr (C == 4) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        is[c] = isum[c][0];
        ws[c] = wsum[c][0];
      }
      adv = _mm_set1_ps(a[0][sb].d);
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        is[r] = r < R ? isum[0][r] : _mm256_setzero_si256();
        ws[r] = r < R ? wsum[0][r] : _mm256_setzero_si256();
      }
      const auto ad = [&](int r) { return r < R ? a[r][sb].d : 0.f; };
      adv = _mm_setr_ps(ad(0), ad(1), ad(2), ad(3));
      dv = _mm_shuffle_ps(dv, dv, 0);
      dminv = _mm_shuffle_ps(dminv, dminv, 0);
    }
    acc = low_bits_step_v(acc, hsum4_epi32(is), dv, adv);
    if constexpr (!kThree) accm = low_bits_step_v(accm, hsum4_epi32(ws), dminv, adv);
  }
  alignas(16) float res[4];
  _mm_store_ps(res, kThree ? acc : _mm_sub_ps(acc, accm));
  for (int i = 0; i < C * R; ++i) out[i] = res[i];
}

// The 16-element sub-block sums of activation rows: out[16 * (row * nsb + sb) + h].
inline void low_bits_row_sums(const ActBlock* b, int nb, int16_t* out) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int i = 0; i < nb; ++i) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].q));
    const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);  // lane l: bytes 4l .. 4l + 3
    __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    h = _mm_hadd_epi32(h, h);  // first half, second half, ...
    out[2 * i] = static_cast<int16_t>(_mm_cvtsi128_si32(h));
    out[2 * i + 1] = static_cast<int16_t>(_mm_extract_epi32(h, 1));
  }
}

// out -= Q2_K's min term for rows x [n0, n1) (the prompt kernels run Q2_K's scaled codes through
// Q6_K's tile, which has no mins): per (row, column) accm = low_bits_step(accm, imin, dmin, a.d)
// super-block by super-block, as LowBitsAcc, and out = acc - accm. Eight columns per vector:
// dword hp of a column's super-block is its (m_2hp, m_2hp+1) pair, against the row's pair of
// sub-block sums (one vpmaddwd); 1/16 of the products of the codes.
inline void q2k_subtract_mins(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                              float* out, int ldo) {
  const int nsb = k / kSuper, nb = k / kBlock;
  thread_local std::vector<int16_t> sums_buf;
  thread_local std::vector<int32_t> mins_buf;
  thread_local std::vector<uint16_t> dmin_buf;
  thread_local std::vector<float> ad_buf;
  int16_t* const sums = grow_scratch(sums_buf, static_cast<size_t>(rows) * nsb * 16);
  // The rows' super-block scales, compact: read from the ActBlocks (40 bytes each) they would be
  // a cache line per row and super-block for every 8 columns (a 512-row prompt's spill out of L2
  // made this pass 12x slower than at 128 rows).
  float* const ads = grow_scratch(ad_buf, static_cast<size_t>(rows) * nsb);
  int32_t* const mins = grow_scratch(mins_buf, static_cast<size_t>(nsb) * 8 * 8);  // [sb][pair][column]
  uint16_t* const dmin = grow_scratch(dmin_buf, static_cast<size_t>(nsb) * 8);    // [sb][column], fp16
  for (int r = 0; r < rows; ++r) {
    low_bits_row_sums(a + static_cast<size_t>(r) * nb, nb, sums + static_cast<size_t>(r) * nsb * 16);
    for (int sb = 0; sb < nsb; ++sb) ads[static_cast<size_t>(r) * nsb + sb] = a[static_cast<size_t>(r) * nb + sb * kSubBlocks].d;
  }
  for (int n = n0; n < n1; n += 8) {
    const int cols = std::min(8, n1 - n);
    for (int c = 0; c < 8; ++c) {
      for (int sb = 0; sb < nsb; ++sb) {
        const uint8_t* blk = c < cols ? w + static_cast<size_t>(n + c) * rb + static_cast<size_t>(sb) * kQ2KBlockBytes
                                      : nullptr;
        for (int hp = 0; hp < 8; ++hp) {
          mins[(sb * 8 + hp) * 8 + c] = blk ? (blk[2 * hp] >> 4) | ((blk[2 * hp + 1] >> 4) << 16) : 0;
        }
        dmin[sb * 8 + c] = blk ? read_u16(blk + 82) : 0;
      }
    }
    // Four rows at a time, each super-block's pairs in two chains: one row's chain of 8 dependent
    // vpdpwssd per super-block left this pass bound by their latency (a 512-row Q2_K product
    // spent as long here as in its codes).
    constexpr int kRows = 4;
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      const int nr = std::min(kRows, rows - r0);
      __m256 accm[kRows];
#pragma GCC unroll 4
      for (int t = 0; t < kRows; ++t) accm[t] = _mm256_setzero_ps();
      for (int sb = 0; sb < nsb; ++sb) {
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dmin + sb * 8)));
        __m256i imin[kRows][2];
#pragma GCC unroll 4
        for (int t = 0; t < kRows; ++t) imin[t][0] = imin[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int hp = 0; hp < 8; ++hp) {
          const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + (sb * 8 + hp) * 8));
#pragma GCC unroll 4
          for (int t = 0; t < kRows; ++t) {
            int32_t pair;  // rows past `rows` reread the last one (their results are dropped)
            std::memcpy(&pair, sums + (static_cast<size_t>(r0 + std::min(t, nr - 1)) * nsb + sb) * 16 + 2 * hp, 4);
            imin[t][hp & 1] = madd_acc(imin[t][hp & 1], m, _mm256_set1_epi32(pair));
          }
        }
#pragma GCC unroll 4
        for (int t = 0; t < kRows; ++t) {
          const __m256 ad = _mm256_set1_ps(ads[static_cast<size_t>(r0 + std::min(t, nr - 1)) * nsb + sb]);
          accm[t] = low_bits_step_v(accm[t], _mm256_add_epi32(imin[t][0], imin[t][1]), dm, ad);
        }
      }
      for (int t = 0; t < nr; ++t) {
        alignas(32) float m8[8];
        _mm256_store_ps(m8, accm[t]);
        float* o = out + static_cast<size_t>(r0 + t) * ldo + n;
        for (int c = 0; c < cols; ++c) o[c] -= m8[c];
      }
    }
  }
}

#else  // portable (scalar and NEON builds)

template <int R, int C, bool kThree>
inline void dot_low_bits(const uint8_t* const* ws, const LowBitsAct* const* a, int nsb, float* out,
                         const uint8_t* /*next*/ = nullptr, size_t /*next_bytes*/ = 0) {
  static_assert(C == 1, "the portable kernel takes one weight row");
  const uint8_t* w = ws[0];
  constexpr int kBytes = kThree ? kQ3KBlockBytes : kQ2KBlockBytes;
  LowBitsAcc acc[R];
  uint8_t q[kSuper];
  int s[16], m[16];
  for (int sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = w + static_cast<size_t>(sb) * kBytes;
    low_bit_codes<kThree>(blk, q);
    float d, dmin = 0.f;
    if constexpr (kThree) {
      int8_t sc[16];
      q3k_scales(blk + 96, sc);
      for (int h = 0; h < 16; ++h) s[h] = sc[h];
      d = half(blk + 108);
    } else {
      for (int h = 0; h < 16; ++h) {
        s[h] = blk[h] & 0x0f;
        m[h] = blk[h] >> 4;
      }
      d = half(blk + 80);
      dmin = half(blk + 82);
    }
    for (int r = 0; r < R; ++r) {
      const LowBitsAct& ar = a[r][sb];
      int32_t isum = 0, ws = 0;
      for (int h = 0; h < 16; ++h) {
        // Sub-block h = 8n + 2j + half: elements 128n + 32j + 16 half .. +15, at run 2j + n.
        const int n = h / 8, j = (h % 8) / 2, half_ = h % 2;
        const uint8_t* qh = q + 128 * n + 32 * j + 16 * half_;
        const int8_t* av = ar.q + 64 * j + 32 * n + 16 * half_;
        int32_t dot = 0;
        for (int i = 0; i < 16; ++i) dot += qh[i] * av[i];
        isum += s[h] * dot;
        ws += (kThree ? s[h] : m[h]) * ar.sums[h];
      }
      if constexpr (kThree) isum -= 4 * ws;
      acc[r].step(isum, d, ws, dmin, ar.d, !kThree);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r].result(!kThree);
}

#endif

// Rows in chunks of kRowChunk, prepared once per chunk; each weight row then meets the chunk's
// rows kRowTile at a time, and the rows left over (decode: the only one) meet four weight rows
// at a time (x86; the same operations per output whatever the tile).
template <bool kThree>
inline void gemm_low_bits(const uint8_t* w, size_t w_row_bytes, const ActBlock* a, int k, int rows, int n0, int n1,
                          float* out, int ldo) {
#if defined(LLMD_ISA_X86)
  constexpr int kCols = 4;
#else
  constexpr int kCols = 1;
#endif
  const int nsb = k / kSuper;
  const int nb = k / kBlock;
  thread_local std::vector<LowBitsAct> scratch;
  LowBitsAct* act = grow_scratch(scratch, static_cast<size_t>(std::min(rows, kRowChunk)) * nsb);
  const auto row_of = [&](int n) { return w + static_cast<size_t>(n) * w_row_bytes; };
  for (int r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int rc = std::min(rows - r0, kRowChunk);
    for (int r = 0; r < rc; ++r) {
      low_bits_prepare(a + static_cast<size_t>(r0 + r) * nb, nsb, act + static_cast<size_t>(r) * nsb);
    }
    // Tiles of kRowTile rows, then the 2-3 rows left as one tile (each weight row read once for
    // them), or a lone row (decode) against four weight rows at a time.
    const int tiled = rc / kRowTile * kRowTile;
    const int rest = rc - tiled;
    const auto run_tiles = [&]<int R>(int r_begin, int r_end) {
      for (int n = n0; n < n1; ++n) {
        const uint8_t* wrow = row_of(n);
        for (int r = r_begin; r < r_end; r += R) {
          const LowBitsAct* tile[R];
          float res[R];
          for (int t = 0; t < R; ++t) tile[t] = act + static_cast<size_t>(r + t) * nsb;
          dot_low_bits<R, 1, kThree>(&wrow, tile, nsb, res);
          for (int t = 0; t < R; ++t) out[static_cast<size_t>(r0 + r + t) * ldo + n] = res[t];
        }
      }
    };
    run_tiles.template operator()<kRowTile>(0, tiled);
    if (rest == 2) run_tiles.template operator()<2>(tiled, rc);
    if (rest == 3) run_tiles.template operator()<3>(tiled, rc);
    if (rest == 1) {
      const LowBitsAct* one = act + static_cast<size_t>(tiled) * nsb;
      float* o = out + static_cast<size_t>(r0 + tiled) * ldo;
      for (int n = n0; n < n1; n += kCols) {
        // A short last group repeats its last row; only the real columns are stored.
        const int cols = std::min(kCols, n1 - n);
        const uint8_t* ws[kCols];
        for (int c = 0; c < kCols; ++c) ws[c] = row_of(n + std::min(c, cols - 1));
        float res[kCols];
        const int ahead = std::min(kCols, n1 - n - kCols);  // the next group's rows, if any
        dot_low_bits<1, kCols, kThree>(ws, &one, nsb, res, ahead > 0 ? row_of(n + kCols) : nullptr,
                                       ahead > 0 ? ahead * w_row_bytes : 0);
        for (int c = 0; c < cols; ++c) o[n + c] = res[c];
      }
    }
  }
}

inline void gemm_q2_k(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1, float* out,
                      int ldo) {
  gemm_low_bits<false>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q3_k(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1, float* out,
                      int ldo) {
  gemm_low_bits<true>(w, rb, a, k, rows, n0, n1, out, ldo);
}

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE
