// K-quant kernels (Q4_K, Q5_K, Q6_K: 256-element super-blocks). Included by qgemm_impl.h inside
// each ISA's translation unit, after its helpers (half, isum_u8s8, hsum).
//
// Block layouts (ggml-common.h):
//   Q4_K, 144 bytes: half d, half dmin, 12 bytes of 6-bit scales/mins for 8 sub-blocks of 32,
//     128 bytes qs. Chunk j = qs[32j .. 32j+31]: low nibbles are sub-block 2j, high nibbles
//     sub-block 2j+1, each in element order. weight = d * sc * q - dmin * m, q in [0, 15].
//   Q5_K, 176 bytes: Q4_K's d, dmin and 12 scale bytes, then qh[32], then Q4_K's qs[128].
//     Bit 2j (2j+1) of qh[l] is the fifth bit of element l of sub-block 2j (2j+1), so q in
//     [0, 31] and the same weight formula: the kernels follow Q4_K's, with the bit ORed in.
//   Q6_K, 210 bytes: ql[128], qh[64], int8 scales[16] (one per 16 elements), half d.
//     weight = d * scale * (q - 32), q in [0, 63]; element order as in dequantize_row_q6_K.
// Each 32-wide activation block lines up with one Q4_K/Q5_K sub-block or two Q6_K sub-blocks.
//
// x86 layout trick: the activation rows are shared by every weight column, so once per call
// each row's int8 blocks are rearranged ("lane-transposed") so that 32-bit lane i of every
// vector holds only elements of activation block i of the super-block; each weight super-block
// is shuffled to the same placement as it is unpacked (a few blends and in-lane shuffles).
// Then the 8 integer dot products of a super-block chain into one vector (VNNI accumulates for
// free) whose lane i is block i's integer sum, and a super-block costs one float FMA per row
// and column (plus one for Q4_K's mins).
//
// Isolation: the driver sweeps rows in chunks but gives every (row, column) its own
// accumulator, fed super-block by super-block in the same order whatever `rows` is.
#pragma once

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

constexpr int kSuper = 256;                   // elements per K-quant super-block
constexpr int kSubBlocks = kSuper / kBlock;   // activation blocks per super-block
constexpr int kQ4KBytes = 144;
constexpr int kQ5KBytes = 176;
constexpr int kQ6KBytes = 210;

#if defined(LLMD_ISA_X86)

// One row's activations for one super-block, lane-transposed (see the top of the file).
struct alignas(32) KqAct {
  int8_t q[kSuper];
  float d[kSubBlocks];      // lane i: block i's scale
  float s[kSubBlocks];      // lane i: block i's d * sum(q)   (Q4_K mins)
  int32_t c[2 * kSubBlocks];  // Q6_K: -32 * sum(q) of each block's first / second 16
};

// Q6_K layout: t[0..3] lane i holds the first 16 bytes of v[i] (sub-block 2i), t[4..7] lane i
// the second 16 bytes (sub-block 2i + 1). Blend-and-swap over pairs of lanes, then lane pairs,
// then the 128-bit halves are regrouped.
inline void kq6_transpose(const __m256i v[8], __m256i t[8]) {
  __m256i x1[8];  // x1[2p + u] lane i: from v[2p + (i & 1)]
  for (int p = 0; p < 4; ++p) {
    const __m256i a = v[2 * p], b = v[2 * p + 1];
    x1[2 * p] = _mm256_blend_epi32(a, b, 0xaa);
    x1[2 * p + 1] = _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0xaa), _MM_SHUFFLE(2, 3, 0, 1));
  }
  __m256i x2[8];  // x2[4q + u] lane i: from v[4q + (i & 3)]
  for (int q = 0; q < 2; ++q) {
    for (int u = 0; u < 2; ++u) {
      const __m256i a = x1[4 * q + u], b = x1[4 * q + 2 + u];
      x2[4 * q + 2 * u] = _mm256_blend_epi32(a, b, 0xcc);
      x2[4 * q + 2 * u + 1] =
          _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0xcc), _MM_SHUFFLE(1, 0, 3, 2));
    }
  }
  for (int u = 0; u < 4; ++u) {
    t[u] = _mm256_permute2x128_si256(x2[u], x2[4 + u], 0x20);
    t[4 + u] = _mm256_permute2x128_si256(x2[u], x2[4 + u], 0x31);
  }
}

// Q4_K layout, cheaper than unpacking 8 vectors and transposing them: the 4 packed chunks are
// transposed at 64-bit granularity first (r[u] lanes 2m, 2m+1 from chunk m, which holds blocks
// 2m and 2m+1), then each r[u] splits into two vectors whose even lanes take low nibbles
// (block 2m) and odd lanes high nibbles (block 2m+1), the second after swapping lane pairs.
inline void kq_transpose64(const __m256i c[4], __m256i r[4]) {
  __m256i x[4];  // x[2p + u]: 64-bit slot s from c[2p + (s & 1)]
  for (int p = 0; p < 2; ++p) {
    const __m256i a = c[2 * p], b = c[2 * p + 1];
    x[2 * p] = _mm256_blend_epi32(a, b, 0xcc);
    x[2 * p + 1] =
        _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0xcc), _MM_SHUFFLE(1, 0, 3, 2));
  }
  for (int u = 0; u < 2; ++u) {
    r[2 * u] = _mm256_blend_epi32(x[u], x[2 + u], 0xf0);
    r[2 * u + 1] = _mm256_permute2x128_si256(x[u], x[2 + u], 0x21);
  }
}

inline void kq4_weights(const uint8_t* qs, __m256i t[8]) {
  __m256i c[4], r[4];
  for (int j = 0; j < 4; ++j) {
    c[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
  }
  kq_transpose64(c, r);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  for (int u = 0; u < 4; ++u) {
    t[2 * u] = _mm256_and_si256(_mm256_srlv_epi32(r[u], shift), m4);
    t[2 * u + 1] = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_shuffle_epi32(r[u], _MM_SHUFFLE(2, 3, 0, 1)), shift), m4);
  }
}

// The same placement for activation bytes: v[m] is block m, in element order.
inline void kq4_acts(const __m256i v[8], __m256i t[8]) {
  __m256i even[4], odd[4], re[4], ro[4];
  for (int j = 0; j < 4; ++j) {
    even[j] = v[2 * j];
    odd[j] = v[2 * j + 1];
  }
  kq_transpose64(even, re);
  kq_transpose64(odd, ro);
  for (int u = 0; u < 4; ++u) {
    t[2 * u] = _mm256_blend_epi32(re[u], ro[u], 0xaa);
    t[2 * u + 1] =
        _mm256_blend_epi32(_mm256_shuffle_epi32(re[u], _MM_SHUFFLE(2, 3, 0, 1)),
                           _mm256_shuffle_epi32(ro[u], _MM_SHUFFLE(2, 3, 0, 1)), 0xaa);
  }
}

template <bool kSplitHalves>
inline void kq_prepare(const ActBlock* b, int nsb, KqAct* out) {
  for (int sb = 0; sb < nsb; ++sb, b += kSubBlocks) {
    KqAct& o = out[sb];
    __m256i v[8], t[8];
    for (int m = 0; m < kSubBlocks; ++m) {
      v[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[m].q));
      o.d[m] = b[m].d;
      o.s[m] = b[m].s;
      if constexpr (kSplitHalves) {
        int lo = 0, hi = 0;
        for (int i = 0; i < 16; ++i) {
          lo += b[m].q[i];
          hi += b[m].q[16 + i];
        }
        o.c[m] = -32 * lo;
        o.c[kSubBlocks + m] = -32 * hi;
      }
    }
    if constexpr (kSplitHalves) {
      kq6_transpose(v, t);
    } else {
      kq4_acts(v, t);
    }
    for (int m = 0; m < kSubBlocks; ++m) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(o.q + 32 * m), t[m]);
    }
  }
}

inline __m256i kq_load(const int8_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

// Q4_K's and Q5_K's d * sc[i] and dmin * m[i] in lane i (the same 16 header bytes in both).
inline void kq4_dscales(const uint8_t* blk, __m256& dsc, __m256& dm) {
  // The 6-bit scales and mins as in the scalar path's kq4_scales, on 32-bit lanes:
  // u = {u0, u1, u2, -} -> bytes {sc[0..3], sc[4..7], m[0..3], m[4..7]}. Reads 16 bytes at
  // blk + 4, inside the block.
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
  const __m128i u22 = _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 2, 2)),
                                     _mm_setr_epi32(0, 4, 0, 0));
  const __m128i lo = _mm_and_si128(u, _mm_set1_epi8(0x3f));
  const __m128i hi = _mm_or_si128(
      _mm_and_si128(u22, _mm_set1_epi8(0x0f)),
      _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u, 6), _mm_set1_epi8(0x03)), 4));
  const __m128i scm = _mm_unpacklo_epi32(lo, hi);
  const __m256 fsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scm));
  const __m256 fmn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8)));
  dsc = _mm256_mul_ps(_mm256_set1_ps(half(blk)), fsc);
  dm = _mm256_mul_ps(_mm256_set1_ps(half(blk + 2)), fmn);
}

struct KqQ4K {
  static constexpr int kBytes = kQ4KBytes;
  static constexpr bool kSplit = false;
  using Act = KqAct;
  using Acc = __m256;
  struct Weights {
    __m256i t[8];  // q in [0, 15], lane-transposed
    __m256 dsc;    // lane i: d * sc[i]
    __m256 dm;     // lane i: dmin * m[i]
  };

  static void unpack(const uint8_t* blk, Weights& w) {
    kq4_dscales(blk, w.dsc, w.dm);
    kq4_weights(blk + 16, w.t);
  }

  static __m256 step(const Weights& w, const Act& a, __m256 acc) {
#if defined(LLMD_ISA_VNNI)
    __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.t[0], kq_load(a.q));
    __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.t[1], kq_load(a.q + 32));
    for (int t = 2; t < 8; t += 2) {
      s0 = _mm256_dpbusd_epi32(s0, w.t[t], kq_load(a.q + 32 * t));
      s1 = _mm256_dpbusd_epi32(s1, w.t[t + 1], kq_load(a.q + 32 * t + 32));
    }
    const __m256i isum = _mm256_add_epi32(s0, s1);
#else
    // |pair| <= 2 * 15 * 127, so eight 16-bit partial sums cannot overflow.
    __m256i s16 = _mm256_maddubs_epi16(w.t[0], kq_load(a.q));
    for (int t = 1; t < 8; ++t) {
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w.t[t], kq_load(a.q + 32 * t)));
    }
    const __m256i isum = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
#endif
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.dsc, _mm256_load_ps(a.d)), acc);
    return _mm256_fnmadd_ps(w.dm, _mm256_load_ps(a.s), acc);
  }
};

// Bit m (0..7) of every byte of qh as 16 in the same byte, 0 elsewhere: Q5_K's fifth bit of
// sub-block m. 16-bit shifts carry bits across bytes, but the 0x10 mask keeps only bit 4 of
// each byte, which comes from bit m of that same byte for shifts of at most 4 left or 3 right.
inline __m256i q5_hbit(__m256i qh, int m) {
  const __m256i x = m <= 4 ? _mm256_slli_epi16(qh, 4 - m) : _mm256_srli_epi16(qh, m - 4);
  return _mm256_and_si256(x, _mm256_set1_epi8(0x10));
}

struct KqQ5K {
  static constexpr int kBytes = kQ5KBytes;
  static constexpr bool kSplit = false;
  using Act = KqAct;
  using Acc = __m256;
  using Weights = KqQ4K::Weights;  // t: q in [0, 31], placed as Q4_K's

  static void unpack(const uint8_t* blk, Weights& w) {
    kq4_dscales(blk, w.dsc, w.dm);
    // The 5-bit quants of each sub-block in element order, then Q4_K's activation placement
    // (kq4_acts moves bytes only, so it places weights and activations alike).
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    __m256i v[8];
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * j));
      v[2 * j] = _mm256_or_si256(_mm256_and_si256(q, m4), q5_hbit(qh, 2 * j));
      v[2 * j + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), q5_hbit(qh, 2 * j + 1));
    }
    kq4_acts(v, w.t);
  }

  static __m256 step(const Weights& w, const Act& a, __m256 acc) {
#if defined(LLMD_ISA_VNNI)
    return KqQ4K::step(w, a, acc);  // dpbusd sums in 32 bits: 5-bit quants change nothing
#else
    // |pair| <= 2 * 31 * 127 = 7874: four 16-bit partial sums fit (31496), eight would not, so
    // each half of the vectors is widened to 32 bits on its own.
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i half16[2];
    for (int u = 0; u < 2; ++u) {
      const int8_t* aq = a.q + 128 * u;
      half16[u] = _mm256_maddubs_epi16(w.t[4 * u], kq_load(aq));
      for (int t = 1; t < 4; ++t) {
        half16[u] = _mm256_add_epi16(half16[u], _mm256_maddubs_epi16(w.t[4 * u + t], kq_load(aq + 32 * t)));
      }
    }
    const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(half16[0], ones), _mm256_madd_epi16(half16[1], ones));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.dsc, _mm256_load_ps(a.d)), acc);
    return _mm256_fnmadd_ps(w.dm, _mm256_load_ps(a.s), acc);
#endif
  }
};

struct KqQ6K {
  static constexpr int kBytes = kQ6KBytes;
  static constexpr bool kSplit = true;
  using Act = KqAct;
  using Acc = __m256;
  struct Weights {
    __m256i t[8];    // q in [0, 63]; t[0..3] first halves of blocks, t[4..7] second halves
    __m256i sc_lo;   // lane i: scales[2i]
    __m256i sc_hi;   // lane i: scales[2i + 1]
    __m256 d;
  };

  static void unpack(const uint8_t* blk, Weights& w) {
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    __m256i v[8];
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
      v[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                     _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
      v[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                     _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
      v[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                     _mm256_and_si256(hb, m30));
      v[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
    }
    kq6_transpose(v, w.t);
    const __m256i s16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    w.sc_lo = _mm256_srai_epi32(_mm256_slli_epi32(s16, 16), 16);
    w.sc_hi = _mm256_srai_epi32(s16, 16);
    w.d = _mm256_set1_ps(half(blk + 208));
  }

  static __m256 step(const Weights& w, const Act& a, __m256 acc) {
    // Starting from -32 * sum(a) turns the u8 x s8 dot of q into the dot of (q - 32).
    __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.c));
    __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.c + kSubBlocks));
#if defined(LLMD_ISA_VNNI)
    for (int t = 0; t < 4; ++t) {
      lo = _mm256_dpbusd_epi32(lo, w.t[t], kq_load(a.q + 32 * t));
      hi = _mm256_dpbusd_epi32(hi, w.t[4 + t], kq_load(a.q + 32 * (4 + t)));
    }
#else
    // |pair| <= 2 * 63 * 127, so two 16-bit partial sums cannot overflow.
    const __m256i ones = _mm256_set1_epi16(1);
    for (int t = 0; t < 4; t += 2) {
      const __m256i l16 =
          _mm256_add_epi16(_mm256_maddubs_epi16(w.t[t], kq_load(a.q + 32 * t)),
                           _mm256_maddubs_epi16(w.t[t + 1], kq_load(a.q + 32 * (t + 1))));
      const __m256i h16 =
          _mm256_add_epi16(_mm256_maddubs_epi16(w.t[4 + t], kq_load(a.q + 32 * (4 + t))),
                           _mm256_maddubs_epi16(w.t[5 + t], kq_load(a.q + 32 * (5 + t))));
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(l16, ones));
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(h16, ones));
    }
#endif
    // |lo|, |hi| <= 16 * 32 * 127 and |scale| <= 128: the scaled sum stays well inside int32.
    const __m256i isum =
        _mm256_add_epi32(_mm256_mullo_epi32(lo, w.sc_lo), _mm256_mullo_epi32(hi, w.sc_hi));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.d, _mm256_load_ps(a.d)), acc);
  }
};

inline float kq_finish(__m256 acc) { return hsum(acc); }

// ------------------------------------------------------------------ 8-row packed layout (pack8.h)
//
// As the Q4_0 packed kernels (qgemm_impl.h): lane c of every vector is output column c, the
// activation's 4 bytes are broadcast, and one pass over a tile super-block serves R activation
// rows and G groups of 8 columns. Per 32-element activation block the integer dot is exact and
// becomes one float FMA per row and group (Q4_K: plus one for the mins), in a fixed block order:
// the same operations in the same order for every tile shape (R, G), so an output does not
// depend on the tile it fell in.

// A single row streams each weight byte once from DRAM, one group at a time (2 or 4 groups at a
// time, more concurrent streams, ran 1.3-2x slower). At the start of each super-block it asks
// for every cache line of that tile at once, so the loads that follow wait on one memory round
// trip with all lines in flight instead of a few at a time. Measured on a 1B Q4_K_M decode step
// (Zen 4, 2 threads, 1 stream): 34-35 ms per step this way, 42-46 ms asking for the tile 4
// super-blocks ahead, 43-46 ms with no software prefetch.
// On an AVX2-only Zen 1 core (2.0 GHz, 2 cores reading ~24 GB/s) the same kernels wait on that
// round trip: the next super-block's tile asked for while this one runs made a 1B decode 8-12%
// faster (Q4_K_M 16.0-16.9 -> 17.5-18.3 tok/s, Q5_K_M 12.4-13.1 -> 14.4-14.6, Q6_K 12.0-12.4 ->
// 13.0-13.5), so the AVX2 build looks one tile ahead. Two tiles ahead gained nothing more
// (Q4_K_M 16.5-17.8, Q5_K_M 14.0-15.2, Q6_K 11.8-12.6: no better than none), and asking for the
// next tile a quarter at a time over the super-block's four passes, instead of all at its start,
// lost (Q6_K 12.2-13.4 -> 10.2-11.4 one ahead, 10.4-11.3 two ahead). The AVX-512 VNNI build
// keeps the measured 0. Prefetches change no result.
#if defined(LLMD_ISA_VNNI)
constexpr int kKqPrefetchAhead = 0;
#else
constexpr int kKqPrefetchAhead = 1;
#endif

// One activation row for dot8_q45k: its per-256 blocks (qgemm.h) and each block's integer sum.
struct KqSumRow {
  const ActBlock* b;
  const int16_t* bsum;  // [block]: sum(q), |sum| <= 32 * 127
};

struct KqSumRows {
  using Row = KqSumRow;
  const ActBlock* a;
  int nb;
  const int16_t* sums;
  KqSumRows(const ActBlock* a_, int rows, int nb_) : a(a_), nb(nb_) {
    thread_local std::vector<int16_t> buf;
    const size_t n = static_cast<size_t>(rows) * nb;
    int16_t* const o = grow_scratch(buf, n);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (size_t i = 0; i < n; ++i) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].q));
      const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);  // lanes of 4-byte sums
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      o[i] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
    }
    sums = o;
  }
  Row row(int r) const { return {a + static_cast<size_t>(r) * nb, sums + static_cast<size_t>(r) * nb}; }
};

// Bytes 8q .. 8q+7 of v (q a constant after unrolling), each twice, as 16 int16: lane c holds
// byte 8q + c in both halves (a vpmaddwd operand that scales both of a lane's int16 sums).
inline __m256i bytes8_dup16(__m256i v, int q) {
  const __m128i half = q < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
  const __m128i b = q % 2 == 0 ? half : _mm_unpackhi_epi64(half, half);
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b));
}

// Bytes 8q + c and 8(q + 1) + c of v (q even) as an int16 pair in lane c.
inline __m256i bytes8_pair16(__m256i v, int q) {
  const __m128i half = q < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(half, _mm_unpackhi_epi64(half, half)));
}

// Q4_K and Q5_K against per-256 activations (qgemm.h), 8 columns in the lanes: per sub-block
// j, lane c: sum_e q[c][e] * a[e] in int16 halves (exact), which one vpmaddwd against column
// c's 6-bit scale sc[j] widens and scales; the super-block's 8 blocks sum in int32
// (|sum| <= 8 * 32 * 31 * 127 * 63 < 2^31), the mins' sum_j m[j] * bsum[j] by four vpmaddwd;
// then once per super-block acc = fma(isc * d - imin * dmin, a.d, acc). Q5_K's tile is Q4_K's
// plus the qh slices, whose bit 2p (2p + 1) is ORed into the low (high) nibbles of chunk p as
// 16. The same operations in the same order for every tile shape (R, G).
template <int R, int G, bool kFive>
inline void dot8_q45k(const uint8_t* w, size_t stride, const KqSumRow* a, int nb, float* const* out, bool stream) {
  constexpr int kTile = 8 * (kFive ? kQ5KBytes : kQ4KBytes);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  // The float sums live in memory, touched once per super-block: AVX2's 16 registers go to
  // the integer chains and isc (kept in registers, acc made Q4_K's 4-row tile spill).
  alignas(32) float acc[R][G][8] = {};
  for (int sb = 0; sb < nb / kSubBlocks; ++sb) {
    if (stream) prefetch_tiles<G, kTile>(w, stride, sb + kKqPrefetchAhead);
    // The 6-bit scales of every column, as bytes: byte 8j + c of sc[g][j / 4] (kept in
    // registers: storing them and reloading 8 bytes at a time stalls store forwarding).
    __m256i sc[G][2];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile;
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 96));
      sc[g][0] = _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32)), m4),
                                 _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
      sc[g][1] = _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64)), m4),
                                 _mm256_and_si256(hb, m30));
    }
    __m256i isc[R][G];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const int b0 = sb * kSubBlocks + 2 * p;  // low nibbles: block b0, high: block b0 + 1
      // A single row has too few independent integer chains to hide maddubs' latency: it keeps
      // a second set of sums for odd h and adds the two after the loop (integer sums are
      // exact: the result is unchanged). Q5_K's 16-bit sums overflow past 4 slices
      // (8 * 2 * 31 * 127 > 32767): two chains of 4 there too, each widened by the scale's
      // vpmaddwd before they are added.
      constexpr bool kWiden = kFive;
      constexpr int kChains = R == 1 || kWiden ? 2 : 1;
      __m256i isum[R][G][2];
      __m256i odd[R][G][2];
#pragma GCC unroll 8
      for (int h = 0; h < 8; ++h) {
        __m256i lo[G], hi[G];
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile + 128 + 256 * p + 32 * h;
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t));
          lo[g] = _mm256_and_si256(q, m4);
          hi[g] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          if constexpr (kFive) {
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t - 256 * p + 1024));
            lo[g] = _mm256_or_si256(lo[g], q5_hbit(qh, 2 * p));
            hi[g] = _mm256_or_si256(hi[g], q5_hbit(qh, 2 * p + 1));
          }
        }
        const bool second = kChains == 2 && (h & 1);
        const bool first_of_chain = kChains == 2 ? h < 2 : h == 0;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i alo = broadcast4(a[r].b[b0].q + 4 * h);
          const __m256i ahi = broadcast4(a[r].b[b0 + 1].q + 4 * h);
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            __m256i(&dst)[2] = second ? odd[r][g] : isum[r][g];
            // int16 lanes: a maddubs term is at most 2 * 15 * 127 = 3810 in magnitude (Q5_K:
            // 7874) and a lane sums 8 of them (30480 < 32767; Q5_K: 4 per chain, 31496).
            const __m256i l16 = _mm256_maddubs_epi16(lo[g], alo);
            const __m256i h16 = _mm256_maddubs_epi16(hi[g], ahi);
            dst[0] = first_of_chain ? l16 : add16_chain(dst[0], l16);
            dst[1] = first_of_chain ? h16 : add16_chain(dst[1], h16);
          }
        }
      }
#pragma GCC unroll 2
      for (int e = 0; e < 2; ++e) {
        const int j = 2 * p + e;
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const __m256i scd = bytes8_dup16(sc[g][j >> 2], j & 3);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            __m256i v;
            if constexpr (kWiden) {
              v = _mm256_add_epi32(_mm256_madd_epi16(isum[r][g][e], scd), _mm256_madd_epi16(odd[r][g][e], scd));
            } else if constexpr (kChains == 2) {
              v = _mm256_madd_epi16(_mm256_add_epi16(isum[r][g][e], odd[r][g][e]), scd);
            } else {
              v = _mm256_madd_epi16(isum[r][g][e], scd);
            }
            isc[r][g] = j == 0 ? v : _mm256_add_epi32(isc[r][g], v);
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile;
      const __m256 dg = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
      const __m256 dmg = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)));
      const __m256i lo0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32));
      const __m256i lo1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 96));
      const __m256i mn[2] = {_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m4),
                                             _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
                             _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30))};
      // Lane c: (m[2u][c], m[2u + 1][c]) as int16, against the row's (bsum[2u], bsum[2u + 1]).
      __m256i mp[4];
      for (int u = 0; u < 4; ++u) mp[u] = bytes8_pair16(mn[u >> 1], 2 * (u & 1));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int16_t* bs = a[r].bsum + sb * kSubBlocks;
        __m256i imin = _mm256_madd_epi16(mp[0], broadcast4(reinterpret_cast<const int8_t*>(bs)));
        for (int u = 1; u < 4; ++u) {
          imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mp[u], broadcast4(reinterpret_cast<const int8_t*>(bs + 2 * u))));
        }
        const __m256 x = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isc[r][g]), dg, _mm256_mul_ps(_mm256_cvtepi32_ps(imin), dmg));
        const __m256 d = _mm256_set1_ps(a[r].b[sb * kSubBlocks].d);
        _mm256_store_ps(acc[r][g], _mm256_fmadd_ps(x, d, _mm256_load_ps(acc[r][g])));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(out[r] + 8 * g, _mm256_load_ps(acc[r][g]));
  }
}

#if defined(LLMD_ISA_VNNI)
// Q4_K and Q5_K on 512-bit vectors, over the kQword tile (pack8.h). Why: the 256-bit kernel
// above spends more instructions unpacking weights (Q5_K: merging the fifth bit from the qh
// slices, 6 more per 32 bytes) and converting per-block sums than on its dot products, and on
// a core with full-width AVX-512 a 512-bit vpdpbusd costs what a 256-bit one does. Here one
// 64-byte load is 8 columns x 8 bytes, Q5_K's fifth bits are a 64-bit mask applied by one
// masked byte add, and the activation qword broadcast against it holds 4 bytes of each of the
// two blocks the slice covers, so lane 2c sums column c's block 2p and lane 2c + 1 its block
// 2p + 1. With per-256 activations (qgemm.h) the blocks' scales then apply in integers, and
// one float conversion and FMA per row serve a whole super-block.

// One activation row's blocks 2p and 2p + 1 as the kernel reads them: quants interleaved by
// dwords (dword 2k: block 2p's bytes 4k .. 4k+3, dword 2k + 1: block 2p + 1's), then the
// pair's scales d and d * sum(q), each broadcast as one qword.
struct KqPair {
  int8_t q[2 * kBlock];
  float d[2];
  float s[2];
  // Integer start of a pair's dot product chains, where a kernel's weights are stored offset
  // (PairSeeds): [half][e] for Q6_K, [0][e] for the whole block otherwise.
  int32_t seed[2][2];
};

// Which seeds KqPairRows computes: none, -32 * the sum of each 16-element half
// (Q6_K: q - 32), or -8 / -16 / -128 * the sum of the whole block (Q4_0's q - 8; Q5_0's q - 16;
// Q8_0, whose packed weights are stored as q + 128 so that they are the unsigned operand of
// vpdpbusd).
enum class PairSeeds { kNone, kHalves32, kWhole8, kWhole16, kWhole128 };

template <PairSeeds kSeeds>
struct KqPairRows {
  using Row = const KqPair*;
  const KqPair* pairs;
  int np;
  KqPairRows(const ActBlock* a, int rows, int nb) : np(nb / 2) {
    thread_local std::vector<KqPair> buf;
    const size_t n = static_cast<size_t>(rows) * np;
    grow_scratch(buf, n);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (size_t i = 0; i < n; ++i) {
      const ActBlock& x = a[2 * i];
      const ActBlock& y = a[2 * i + 1];
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q));
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.q));
      // unpack*_epi32 interleave within 128-bit halves: lo = x0 y0 x1 y1 | x4 y4 x5 y5,
      // hi = x2 y2 x3 y3 | x6 y6 x7 y7.
      const __m256i lo = _mm256_unpacklo_epi32(qx, qy);
      const __m256i hi = _mm256_unpackhi_epi32(qx, qy);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf[i].q), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf[i].q + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
      buf[i].d[0] = x.d;
      buf[i].d[1] = y.d;
      buf[i].s[0] = x.s;
      buf[i].s[1] = y.s;
      if constexpr (kSeeds != PairSeeds::kNone) {
        // Lanes of 4-byte sums (maddubs sees the activations as the signed operand); two
        // horizontal adds leave x's and y's first-16 sums in lanes 0 and 1, their second-16
        // sums in lanes 4 and 5.
        const __m256i sx = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qx), ones16);
        const __m256i sy = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qy), ones16);
        const __m256i h = _mm256_hadd_epi32(sx, sy);
        const __m256i hh = _mm256_hadd_epi32(h, h);
        const __m128i lo = _mm256_castsi256_si128(hh), hi = _mm256_extracti128_si256(hh, 1);
        const __m128i z = _mm_setzero_si128();
        if constexpr (kSeeds == PairSeeds::kHalves32) {
          _mm_storel_epi64(reinterpret_cast<__m128i*>(buf[i].seed[0]), _mm_sub_epi32(z, _mm_slli_epi32(lo, 5)));
          _mm_storel_epi64(reinterpret_cast<__m128i*>(buf[i].seed[1]), _mm_sub_epi32(z, _mm_slli_epi32(hi, 5)));
        } else {
          constexpr int kShift = kSeeds == PairSeeds::kWhole8 ? 3 : kSeeds == PairSeeds::kWhole16 ? 4 : 7;
          const __m128i whole = _mm_add_epi32(lo, hi);
          _mm_storel_epi64(reinterpret_cast<__m128i*>(buf[i].seed[0]), _mm_sub_epi32(z, _mm_slli_epi32(whole, kShift)));
        }
      }
    }
    pairs = buf.data();
  }
  Row row(int r) const { return pairs + static_cast<size_t>(r) * np; }
};

inline uint64_t load_u64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline __m512 broadcast_pair(const float* p) {
  return _mm512_castpd_ps(_mm512_set1_pd(std::bit_cast<double>(load_u64(p))));
}

// One activation row's super-block for dot8_q45k_zmm, from per-256 activations (qgemm.h): the
// quants of block pairs 2p, 2p + 1 interleaved by dwords as KqPair's (pair p at 64p), the
// blocks' integer sums as the vpdpwssd operands of the mins (bsum[4h .. 4h + 3] = the sums of
// blocks 4h, 4h + 2, 4h + 1, 4h + 3) and the super-block's one scale. Cache-line aligned (276 ->
// 320 bytes): packed 276 bytes apart, every other super-block's qword broadcasts sat at 4 mod 8
// and one in eight of them straddled two cache lines (aligned, a copy of the 8-row Q5_K kernel
// went 267-270 -> 283 GMAC/s on a Zen 5 core; bench/README.md, issue 31).
struct alignas(64) KqSuper {
  int8_t q[kSuper];
  int16_t bsum[kSubBlocks];
  float d;
};

struct KqSuperRows {
  using Row = const KqSuper*;
  const KqSuper* supers;
  int nsb;
  KqSuperRows(const ActBlock* a, int rows, int nb) : nsb(nb / kSubBlocks) {
    thread_local std::vector<KqSuper> buf;
    const size_t n = static_cast<size_t>(rows) * nsb;
    grow_scratch(buf, n);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    constexpr int kSumSlot[kSubBlocks] = {0, 2, 1, 3, 4, 6, 5, 7};  // block j's place in bsum
    for (size_t i = 0; i < n; ++i) {
      const ActBlock* b = a + kSubBlocks * i;
      KqSuper& o = buf[i];
      for (int p = 0; p < kSubBlocks / 2; ++p) {
        const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[2 * p].q));
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[2 * p + 1].q));
        const __m256i lo = _mm256_unpacklo_epi32(qx, qy);
        const __m256i hi = _mm256_unpackhi_epi32(qx, qy);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q + 64 * p), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q + 64 * p + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
      }
      for (int j = 0; j < kSubBlocks; ++j) {
        // Lanes of 4-byte sums (the activations as maddubs' signed operand), then across lanes.
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[j].q));
        const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        o.bsum[kSumSlot[j]] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));  // |sum| <= 32 * 127
      }
      o.d = b[0].d;  // the 8 blocks' shared scale
    }
    supers = buf.data();
  }
  Row row(int r) const { return supers + static_cast<size_t>(r) * nsb; }
};

// Q4_K and Q5_K against per-256 activations. Per pair of blocks, lane 2c (2c + 1): column c's
// exact integer sum over block 2p (2p + 1), times that block's 6-bit scale, summed over the
// super-block's 4 pairs in int32; the mins' sum_j m[j] * bsum[j] in int32 by two vpdpwssd per
// row; each lane pair then adds its two halves (both lanes hold column c's whole super-block,
// |isc| <= 8 * 32 * 31 * 127 * 63 < 2^31), so one float epilogue per super-block serves both
// parities: acc = fma(isc * d - imin * dmin, a.d, acc), out = acc[2c] at the end (why one sum,
// not one accumulator per parity: the blocked prefill kernel holds a parity per vector, and one
// epilogue instead of two per super-block is ~a tenth of its non-dot work; bench/README.md,
// issue 31). The same operations in the same order for every row count R, so an output does not
// depend on the tile it fell in.
template <int R, bool kFive>
inline void dot8_q45k_zmm(const uint8_t* w, const KqSuper* const* a, int nb, float* const* out, bool stream) {
  constexpr int kTile = 8 * (kFive ? kQ5KBytes : kQ4KBytes);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i v16 = _mm512_set1_epi8(0x10);
  const __m256i m4y = _mm256_set1_epi8(0x0f);
  const __m256i m30y = _mm256_set1_epi8(0x30);
  const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  // The mins' vpdpwssd operand h from the bytes 8j' + c (j' = j - 4h) of mn[h]: lane 2c + e holds
  // the int16 pair (m[4h + e][c], m[4h + 2 + e][c]), matching bsum's order.
  alignas(64) static constexpr int16_t kMinIdx[32] = {0, 16, 8, 24, 1, 17, 9, 25, 2, 18, 10, 26, 3, 19, 11, 27,
                                                       4, 20, 12, 28, 5, 21, 13, 29, 6, 22, 14, 30, 7, 23, 15, 31};
  const __m512i min_idx = _mm512_load_si512(kMinIdx);
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int sb = 0; sb < nb / kSubBlocks; ++sb) {
    if (stream) prefetch_tiles<1, kTile>(w, 0, sb + kKqPrefetchAhead);
    const uint8_t* t = w + static_cast<size_t>(sb) * kTile;
    const __m512 dg = _mm512_permutexvar_ps(
        pairs, _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)))));
    const __m512 dmg = _mm512_permutexvar_ps(
        pairs, _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)))));
    // The 6-bit scales and mins as bytes 8j + c (j < 4 in [0], j >= 4 in [1]), as dot8_q45k.
    const __m256i lo0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32));
    const __m256i lo1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 96));
    const __m256i sc[2] = {
        _mm256_or_si256(_mm256_and_si256(lo0, m4y), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30y)),
        _mm256_or_si256(_mm256_and_si256(lo1, m4y), _mm256_and_si256(hb, m30y))};
    const __m256i mn[2] = {_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m4y),
                                           _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30y)),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4y),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30y))};
    const __m512i mins[2] = {_mm512_permutexvar_epi16(min_idx, _mm512_cvtepu8_epi16(mn[0])),
                             _mm512_permutexvar_epi16(min_idx, _mm512_cvtepu8_epi16(mn[1]))};
    __m512i isc[R];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      // Bytes 0-7: sub-block 2p of columns 0-7, bytes 8-15: sub-block 2p + 1; interleaved so
      // that byte 2c is column c's scale of block 2p and byte 2c + 1 of block 2p + 1.
      const __m128i s16 = (p & 1) ? _mm256_extracti128_si256(sc[p >> 1], 1) : _mm256_castsi256_si128(sc[p >> 1]);
      const __m512i scp = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s16, _mm_unpackhi_epi64(s16, s16)));
      // A lone row has too few dpbusd chains to hide its latency: it sums the low and high
      // nibbles in two chains, added once (integer sums are exact: the result is unchanged).
      // A tile of rows keeps one chain per row, leaving registers for isc and acc.
      constexpr int kChains = R < 4 ? 2 : 1;
      __m512i isum[R][kChains];
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        const __m512i q = _mm512_loadu_si512(t + 128 + 256 * p + 64 * s);
        __m512i lo = _mm512_and_si512(q, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if constexpr (kFive) {
          const uint8_t* mk = t + 1152 + 64 * p + 16 * s;
          lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(load_u64(mk)), lo, v16);
          hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(load_u64(mk + 8)), hi, v16);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* aq = a[r][sb].q + 64 * p + 16 * s;
          const __m512i alo = _mm512_set1_epi64(static_cast<long long>(load_u64(aq)));
          const __m512i ahi = _mm512_set1_epi64(static_cast<long long>(load_u64(aq + 8)));
          const __m512i z = _mm512_setzero_si512();
          isum[r][0] = _mm512_dpbusd_epi32(s == 0 ? z : isum[r][0], lo, alo);
          isum[r][kChains - 1] = _mm512_dpbusd_epi32(s == 0 && kChains == 2 ? z : isum[r][kChains - 1], hi, ahi);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i sum = kChains == 2 ? _mm512_add_epi32(isum[r][0], isum[r][kChains - 1]) : isum[r][0];
        const __m512i v = _mm512_mullo_epi32(sum, scp);
        isc[r] = p == 0 ? v : _mm512_add_epi32(isc[r], v);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const KqSuper& as = a[r][sb];
      const __m512i b0 = _mm512_set1_epi64(static_cast<long long>(load_u64(as.bsum)));
      const __m512i b1 = _mm512_set1_epi64(static_cast<long long>(load_u64(as.bsum + 4)));
      const __m512i imin = _mm512_dpwssd_epi32(_mm512_madd_epi16(mins[0], b0), mins[1], b1);
      // Lanes 2c and 2c + 1 both get column c's sums over both parities.
      const __m512i isc2 = _mm512_add_epi32(isc[r], _mm512_shuffle_epi32(isc[r], _MM_PERM_CDAB));
      const __m512i imin2 = _mm512_add_epi32(imin, _mm512_shuffle_epi32(imin, _MM_PERM_CDAB));
      const __m512 x = _mm512_fmsub_ps(_mm512_cvtepi32_ps(isc2), dg, _mm512_mul_ps(_mm512_cvtepi32_ps(imin2), dmg));
      acc[r] = _mm512_fmadd_ps(x, _mm512_set1_ps(as.d), acc[r]);
    }
  }
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out[r], _mm512_castps512_ps256(_mm512_permutexvar_ps(evens, acc[r])));
  }
}

// Q6_K on 512-bit vectors over its kQword tile (pack8.h), the same lane pairs as Q4_K/Q5_K:
// a slice's low nibbles take their 2 high bits from a qh byte's bits 0-1 (even slice) or
// 4-5 (odd), its high nibbles from bits 2-3 or 6-7. Per pair of blocks and 16-element half,
// lane 2c (2c + 1): the exact integer dot of column c's q - 32 with block 2p (2p + 1), the
// chain seeded with -32 * sum(a), times the half's int8 scale, summed over the super-block in
// int32 (per-256 activations: the 8 blocks share one scale; |sum| <= 16 * 16 * 32 * 127 * 128 <
// 2^31 once the lane pair's two parities are added); then once per super-block acc =
// fma(isc * d, a.d, acc), as the AVX2 prefill kernel does (one float step per super-block
// instead of one per block: bench/README.md, issue 31). The same operations in the same order
// for every row count R.
template <int R>
inline void dot8_q6k_zmm(const uint8_t* w, const KqPair* const* a, int nb, float* const* out, bool stream) {
  constexpr int kTile = 8 * kQ6KBytes;
  // A tile of few rows has too few dpbusd chains to hide its latency: lone rows (decode)
  // split each into low and high nibbles (exact integer sums: the result is unchanged).
  constexpr bool kSplit = R < 4;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int sb = 0; sb < nb / kSubBlocks; ++sb) {
    if (stream) prefetch_tiles<1, kTile>(w, 0, sb + kKqPrefetchAhead);
    const uint8_t* t = w + static_cast<size_t>(sb) * kTile;
    const __m512 dg = _mm512_permutexvar_ps(
        pairs, _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)))));
    __m512i isc[R];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const int pi = sb * (kSubBlocks / 2) + p;
      __m512i scv[2];  // lane 2c + e: column c's int8 scale of half hf of block 2p + e
#pragma GCC unroll 2
      for (int hf = 0; hf < 2; ++hf) {
        scv[hf] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16 + 32 * p + 16 * hf)));
      }
      __m512i isum[R][2][2];  // [row][half][low / high nibbles, kSplit only]
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          isum[r][u][0] = _mm512_set1_epi64(static_cast<long long>(load_u64(a[r][pi].seed[u])));
          if constexpr (kSplit) isum[r][u][1] = _mm512_setzero_si512();
        }
        const __m512i qh = _mm512_loadu_si512(t + 1168 + 128 * p + 64 * u);
#pragma GCC unroll 2
        for (int v = 0; v < 2; ++v) {
          const int sl = 2 * u + v;
          const __m512i ql = _mm512_loadu_si512(t + 144 + 256 * p + 64 * sl);
          const __m512i hlo = v == 0 ? _mm512_slli_epi16(qh, 4) : qh;
          const __m512i hhi = v == 0 ? _mm512_slli_epi16(qh, 2) : _mm512_srli_epi16(qh, 2);
          const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(hlo, m30));
          const __m512i hi =
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(hhi, m30));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* aq = a[r][pi].q + 16 * sl;
            const __m512i alo = _mm512_set1_epi64(static_cast<long long>(load_u64(aq)));
            const __m512i ahi = _mm512_set1_epi64(static_cast<long long>(load_u64(aq + 8)));
            isum[r][u][0] = _mm512_dpbusd_epi32(isum[r][u][0], lo, alo);
            isum[r][u][kSplit ? 1 : 0] = _mm512_dpbusd_epi32(isum[r][u][kSplit ? 1 : 0], hi, ahi);
          }
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512i h0 = isum[r][0][0], h1 = isum[r][1][0];
        if constexpr (kSplit) {
          h0 = _mm512_add_epi32(h0, isum[r][0][1]);
          h1 = _mm512_add_epi32(h1, isum[r][1][1]);
        }
        const __m512i v = _mm512_add_epi32(_mm512_mullo_epi32(h0, scv[0]), _mm512_mullo_epi32(h1, scv[1]));
        isc[r] = p == 0 ? v : _mm512_add_epi32(isc[r], v);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // Lanes 2c and 2c + 1 both get column c's sum over both parities.
      const __m512i isc2 = _mm512_add_epi32(isc[r], _mm512_shuffle_epi32(isc[r], _MM_PERM_CDAB));
      const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(isc2), dg);
      acc[r] = _mm512_fmadd_ps(x, _mm512_set1_ps(a[r][sb * (kSubBlocks / 2)].d[0]), acc[r]);
    }
  }
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out[r], _mm512_castps512_ps256(_mm512_permutexvar_ps(evens, acc[r])));
  }
}
#endif

// Q6_K rows: the blocks plus, per block, the integer sums of its two 16-element halves
// (weights are stored as q in [0, 63]; dot(q - 32, a) = dot(q, a) - 32 * sum(a)).
struct Q6Row {
  const ActBlock* b;
  const int32_t* hs;  // per block: -32 * sum(first 16), -32 * sum(second 16), both sums as int16 pair, 0
};

struct Q6Rows {
  using Row = Q6Row;
  const ActBlock* a;
  int nb;
  const int32_t* sums;
  Q6Rows(const ActBlock* a_, int rows, int nb_) : a(a_), nb(nb_) {
    thread_local std::vector<int32_t> buf;
    grow_scratch(buf, static_cast<size_t>(rows) * nb * 4);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (size_t i = 0; i < static_cast<size_t>(rows) * nb; ++i) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].q));
      const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);  // lane: 4 bytes
      __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      h = _mm_hadd_epi32(h, h);  // [sum lo, sum hi, sum lo, sum hi]
      const int32_t lo = _mm_cvtsi128_si32(h);
      const int32_t hi = _mm_extract_epi32(h, 1);
      int32_t* o = buf.data() + 4 * i;
      o[0] = -32 * lo;
      o[1] = -32 * hi;
      o[2] = static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xffffu) | (static_cast<uint32_t>(hi) << 16));
      o[3] = 0;
    }
    sums = buf.data();
  }
  Row row(int r) const {
    return {a + static_cast<size_t>(r) * nb, sums + static_cast<size_t>(r) * nb * 4};
  }
};

// The 6-bit quants of one slice for the blocks of the low (t = p) and high (t = p + 2) nibbles
// of ql, with their 2 high bits from qh (bits 2t, 2t + 1 of each byte).
inline void q6_slice(const uint8_t* ql, const uint8_t* qh, int p, __m256i& wa, __m256i& wb) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  const __m256i ha = p == 0 ? _mm256_slli_epi16(hb, 4) : _mm256_slli_epi16(hb, 2);
  const __m256i hh = p == 0 ? hb : _mm256_srli_epi16(hb, 2);
  wa = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(ha, m30));
  wb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m4), _mm256_and_si256(hh, m30));
}

// Q6_K: per block, lane c: isum = sc_lo * dot(q - 32, first 16) + sc_hi * dot(q - 32, second
// 16) (exact). The 256-bit VNNI build then does acc = fma(isum, d * a.d, acc) per block — the
// row-major kernel's formula — in the order 0, 2, 1, 3, 4, 6, 5, 7 of each super-block (the
// order ql pairs them), the same for every tile shape; the AVX2 build adds the 8 blocks' isum
// in int32 (the activations share one scale per super-block) and does that step once per
// super-block, as its multi-row kernel dot8_q6k_x does.
template <int R, int G>
inline void dot8_q6k(const uint8_t* w, size_t stride, const Q6Row* a, int nb, float* const* out, bool stream) {
  constexpr int kTile = 8 * kQ6KBytes;
  __m256 acc[R][G];
  zero_tiles(acc);
  for (int sb = 0; sb < nb / kSubBlocks; ++sb) {
    if (stream) prefetch_tiles<G, kTile>(w, stride, sb + kKqPrefetchAhead);
    __m256 dg[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile;
      dg[g] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
    }
#if !defined(LLMD_ISA_VNNI)
    __m256i ssum[R][G];  // the super-block's integer sum per (row, group)
#endif
#pragma GCC unroll 4
    for (int hp = 0; hp < 4; ++hp) {
      const int h = hp >> 1, p = hp & 1;
      const int bl[2] = {4 * h + p, 4 * h + p + 2};  // blocks of the low / high nibbles
      // Per group and block: lane c holds (scales[2b], scales[2b + 1]) of column c as int16.
      __m256i scp[G][2];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile + 16;
        for (int e = 0; e < 2; ++e) {
          scp[g][e] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16 * bl[e])));
        }
      }
      __m256i isum[R][G][2];
#if defined(LLMD_ISA_VNNI)
      // Half-block chains seeded with -32 * sum(a); scaled by the half's scale when complete.
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m256i part[R][G][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            for (int e = 0; e < 2; ++e) {
              part[r][g][e] = _mm256_set1_epi32(a[r].hs[4 * (sb * kSubBlocks + bl[e]) + half]);
            }
          }
        }
#pragma GCC unroll 4
        for (int i = 4 * half; i < 4 * half + 4; ++i) {
          __m256i wv[G][2];
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile;
            q6_slice(t + 144 + 512 * h + 256 * p + 32 * i, t + 1168 + 256 * h + 32 * i, p, wv[g][0], wv[g][1]);
          }
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
            for (int e = 0; e < 2; ++e) {
              const __m256i av = broadcast4(a[r].b[sb * kSubBlocks + bl[e]].q + 4 * i);
#pragma GCC unroll 8
              for (int g = 0; g < G; ++g) part[r][g][e] = _mm256_dpbusd_epi32(part[r][g][e], wv[g][e], av);
            }
          }
        }
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          for (int e = 0; e < 2; ++e) {
            const __m256i s32 = half == 0 ? _mm256_srai_epi32(_mm256_slli_epi32(scp[g][e], 16), 16)
                                          : _mm256_srai_epi32(scp[g][e], 16);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
              const __m256i v = _mm256_mullo_epi32(part[r][g][e], s32);
              isum[r][g][e] = half == 0 ? v : _mm256_add_epi32(isum[r][g][e], v);
            }
          }
        }
      }
#else
      // Pairs of slices in int16 (|pair| <= 2 * 63 * 127 each, two of them fit), scaled by
      // madd against the half's scale in both int16 halves of the lane; the -32 * sum(a)
      // term is one more madd of (-32 * scales) against the row's two half sums.
      __m256i sc16[G][2][2];  // [g][e][half]
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        for (int e = 0; e < 2; ++e) {
          sc16[g][e][0] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(scp[g][e], 0xa0), 0xa0);
          sc16[g][e][1] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(scp[g][e], 0xf5), 0xf5);
          const __m256i m32 = _mm256_mullo_epi16(scp[g][e], _mm256_set1_epi16(-32));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            isum[r][g][e] =
                _mm256_madd_epi16(m32, _mm256_set1_epi32(a[r].hs[4 * (sb * kSubBlocks + bl[e]) + 2]));
          }
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < 8; i += 2) {
        __m256i w0[G][2], w1[G][2];
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const uint8_t* t = w + g * stride + static_cast<size_t>(sb) * kTile;
          q6_slice(t + 144 + 512 * h + 256 * p + 32 * i, t + 1168 + 256 * h + 32 * i, p, w0[g][0], w0[g][1]);
          q6_slice(t + 144 + 512 * h + 256 * p + 32 * (i + 1), t + 1168 + 256 * h + 32 * (i + 1), p, w1[g][0],
                   w1[g][1]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
          for (int e = 0; e < 2; ++e) {
            const int8_t* q = a[r].b[sb * kSubBlocks + bl[e]].q;
            const __m256i a0 = broadcast4(q + 4 * i);
            const __m256i a1 = broadcast4(q + 4 * i + 4);
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
              const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w0[g][e], a0), _mm256_maddubs_epi16(w1[g][e], a1));
              isum[r][g][e] = add32_chain(isum[r][g][e], _mm256_madd_epi16(s16, sc16[g][e][i >> 2]));
            }
          }
        }
      }
#endif
#if defined(LLMD_ISA_VNNI)
#pragma GCC unroll 2
      for (int e = 0; e < 2; ++e) {
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const float ad = a[r].b[sb * kSubBlocks + bl[e]].d;
            acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][g][e]), _mm256_mul_ps(dg[g], _mm256_set1_ps(ad)),
                                        acc[r][g]);
          }
        }
      }
#else
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i both = _mm256_add_epi32(isum[r][g][0], isum[r][g][1]);
          ssum[r][g] = hp == 0 ? both : _mm256_add_epi32(ssum[r][g], both);
        }
      }
#endif
    }
#if !defined(LLMD_ISA_VNNI)
    // The activations share one scale per super-block (uses_superblock_activations), so the
    // 8 blocks' exact integer sums take one float step: dot8_q6k_x's, in the same form.
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float ad = a[r].b[sb * kSubBlocks].d;
        acc[r][g] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(ssum[r][g]), _mm256_mul_ps(dg[g], _mm256_set1_ps(ad)), acc[r][g]);
      }
    }
#endif
  }
  store_tiles(acc, out);
}

#if defined(LLMD_ISA_VNNI)
// Activation rows per Q4_K/Q5_K tile on the 512-bit path: 8 rows (8 accumulators and 16 sum
// chains in AVX-512's 32 registers) beside 4 and 6 gave a 512 x 2048 x 2048 Q5_K product 258
// against 236 and 253 GMAC/s on one Zen 5 core.
constexpr int kKq45RowTile = 8;
#else
constexpr int kKq45RowTile = kRowTile;
#endif

// The AVX-512 path runs the 512-bit kernels over the kQword tile (make_table asks the engine
// to pack that layout), the AVX2 path the 256-bit ones over the kDword tile.
#if defined(LLMD_ISA_VNNI)
using Kq45Rows = KqSuperRows;
#else
using Kq45Rows = KqSumRows;
#endif

template <int R, int G, bool kFive>
inline void dot8_q45k_path(const uint8_t* w, size_t stride, const Kq45Rows::Row* a, int nb, float* const* out,
                           bool stream) {
#if defined(LLMD_ISA_VNNI)
  static_assert(G == 1, "the K-quant kernels take one group at a time");
  (void)stride;
  dot8_q45k_zmm<R, kFive>(w, a, nb, out, stream);
#else
  dot8_q45k<R, G, kFive>(w, stride, a, nb, out, stream);
#endif
}

template <int R, int G>
struct Dot8Q4K {
  static constexpr int kSingleRowGroups = 1;
  static constexpr int kRowTile = kKq45RowTile;
  using Rows = Kq45Rows;
  static void run(const uint8_t* w, size_t stride, const Rows::Row* a, int nb, float* const* out, bool stream) {
    dot8_q45k_path<R, G, false>(w, stride, a, nb, out, stream);
  }
};
template <int R, int G>
struct Dot8Q5K {
  static constexpr int kSingleRowGroups = 1;
  static constexpr int kRowTile = kKq45RowTile;
  using Rows = Kq45Rows;
  static void run(const uint8_t* w, size_t stride, const Rows::Row* a, int nb, float* const* out, bool stream) {
    dot8_q45k_path<R, G, true>(w, stride, a, nb, out, stream);
  }
};
template <int R, int G>
struct Dot8Q6K {
  static constexpr int kSingleRowGroups = 1;
#if defined(LLMD_ISA_VNNI)
  static constexpr int kRowTile = kKq45RowTile;
  using Rows = KqPairRows<PairSeeds::kHalves32>;
  static void run(const uint8_t* w, size_t /*stride*/, const KqPair* const* a, int nb, float* const* out,
                  bool stream) {
    static_assert(G == 1, "the K-quant kernels take one group at a time");
    dot8_q6k_zmm<R>(w, a, nb, out, stream);
  }
#else
  using Rows = Q6Rows;
  static void run(const uint8_t* w, size_t stride, const Q6Row* a, int nb, float* const* out, bool stream) {
    dot8_q6k<R, G>(w, stride, a, nb, out, stream);
  }
#endif
};

inline void gemm_q4_k_x8(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1, float* out,
                         int ldo) {
  gemm_packed<Dot8Q4K>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q5_k_x8(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1, float* out,
                         int ldo) {
  gemm_packed<Dot8Q5K>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q6_k_x8(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1, float* out,
                         int ldo) {
  gemm_packed<Dot8Q6K>(w, rb, a, k, rows, n0, n1, out, ldo);
}

#else  // portable scalar path

// Q4_K's 6-bit scales and mins (the packing of get_scale_min_k4), 4 at a time through 32-bit
// words: bytes 0-3 hold sc[0..3] plus the top 2 bits of sc[4..7], bytes 4-7 the same for the
// mins, bytes 8-11 the low nibbles of sc[4..7] (low) and m[4..7] (high). Little-endian.
inline void kq4_scales(const uint8_t* p, uint8_t sc[8], uint8_t mn[8]) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  const uint32_t s_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  const uint32_t s_lo = u[0] & 0x3f3f3f3fu;
  const uint32_t m_lo = u[1] & 0x3f3f3f3fu;
  std::memcpy(sc, &s_lo, 4);
  std::memcpy(sc + 4, &s_hi, 4);
  std::memcpy(mn, &m_lo, 4);
  std::memcpy(mn + 4, &m_hi, 4);
}

struct KqAct {
  const ActBlock* b;  // the super-block's 8 activation blocks, used in place
};

template <bool kSplitHalves>
inline void kq_prepare(const ActBlock* b, int nsb, KqAct* out) {
  for (int sb = 0; sb < nsb; ++sb) out[sb].b = b + static_cast<size_t>(sb) * kSubBlocks;
}

struct KqQ4K {
  static constexpr int kBytes = kQ4KBytes;
  static constexpr bool kSplit = false;
  using Act = KqAct;
  using Acc = float;
  struct Weights {
    uint8_t q[kSuper];  // in element order (Q5_K: the fifth bit included)
    float dsc[8];
    float dm[8];
  };

  static void unpack(const uint8_t* blk, Weights& w) {
    uint8_t sc[8], mn[8];
    kq4_scales(blk + 4, sc, mn);
    const float d = half(blk), dmin = half(blk + 2);
    for (int j = 0; j < 8; ++j) {
      w.dsc[j] = d * static_cast<float>(sc[j]);
      w.dm[j] = dmin * static_cast<float>(mn[j]);
    }
    const uint8_t* qs = blk + 16;
    for (int j = 0; j < 4; ++j) {
      for (int i = 0; i < 32; ++i) {
        w.q[64 * j + i] = qs[32 * j + i] & 0x0f;
        w.q[64 * j + 32 + i] = qs[32 * j + i] >> 4;
      }
    }
  }

  static float step(const Weights& w, const Act& a, float acc) {
    for (int j = 0; j < kSubBlocks; ++j) {
      const ActBlock& ab = a.b[j];
      int isum = 0;
      for (int i = 0; i < kBlock; ++i) isum += w.q[32 * j + i] * ab.q[i];
      acc = std::fma(static_cast<float>(isum), w.dsc[j] * ab.d, acc);
      acc = std::fma(-w.dm[j], ab.s, acc);
    }
    return acc;
  }
};

// Q5_K: Q4_K's maths on q in [0, 31] (the fifth bit from qh), so it reuses Q4_K's step.
struct KqQ5K {
  static constexpr int kBytes = kQ5KBytes;
  static constexpr bool kSplit = false;
  using Act = KqAct;
  using Acc = float;
  using Weights = KqQ4K::Weights;

  static void unpack(const uint8_t* blk, Weights& w) {
    uint8_t sc[8], mn[8];
    kq4_scales(blk + 4, sc, mn);
    const float d = half(blk), dmin = half(blk + 2);
    for (int j = 0; j < 8; ++j) {
      w.dsc[j] = d * static_cast<float>(sc[j]);
      w.dm[j] = dmin * static_cast<float>(mn[j]);
    }
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + 48;
    for (int j = 0; j < 4; ++j) {
      for (int i = 0; i < 32; ++i) {
        w.q[64 * j + i] = static_cast<uint8_t>((qs[32 * j + i] & 0x0f) | (((qh[i] >> (2 * j)) & 1) << 4));
        w.q[64 * j + 32 + i] = static_cast<uint8_t>((qs[32 * j + i] >> 4) | (((qh[i] >> (2 * j + 1)) & 1) << 4));
      }
    }
  }

  static float step(const Weights& w, const Act& a, float acc) { return KqQ4K::step(w, a, acc); }
};

struct KqQ6K {
  static constexpr int kBytes = kQ6KBytes;
  static constexpr bool kSplit = true;
  using Act = KqAct;
  using Acc = float;
  struct Weights {
    int8_t q[kSuper];  // q - 32, in element order
    int sc[16];
    float d;
  };

  static void unpack(const uint8_t* blk, Weights& w) {
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t* lo = ql + 64 * h;
        const int hb = qh[32 * h + l];
        int8_t* q = w.q + 128 * h;
        q[l] = static_cast<int8_t>(((lo[l] & 0x0f) | ((hb & 3) << 4)) - 32);
        q[l + 32] = static_cast<int8_t>(((lo[l + 32] & 0x0f) | (((hb >> 2) & 3) << 4)) - 32);
        q[l + 64] = static_cast<int8_t>(((lo[l] >> 4) | (((hb >> 4) & 3) << 4)) - 32);
        q[l + 96] = static_cast<int8_t>(((lo[l + 32] >> 4) | (((hb >> 6) & 3) << 4)) - 32);
      }
    }
    for (int j = 0; j < 16; ++j) w.sc[j] = static_cast<int8_t>(blk[192 + j]);
    w.d = half(blk + 208);
  }

  static float step(const Weights& w, const Act& a, float acc) {
    for (int j = 0; j < kSubBlocks; ++j) {
      const ActBlock& ab = a.b[j];
      int lo = 0, hi = 0;
      for (int i = 0; i < 16; ++i) {
        lo += w.q[32 * j + i] * ab.q[i];
        hi += w.q[32 * j + 16 + i] * ab.q[16 + i];
      }
      const int isum = w.sc[2 * j] * lo + w.sc[2 * j + 1] * hi;
      acc = std::fma(static_cast<float>(isum), w.d * ab.d, acc);
    }
    return acc;
  }
};

inline float kq_finish(float acc) { return acc; }

#endif

// Rows are swept in chunks of kRowChunk, whose prepared activations stay in cache; within a
// chunk, each weight super-block is unpacked once and applied to every row, each (row, column)
// keeping its own accumulator fed in super-block order. With several rows, columns go in
// tiles of kKqColTile so that one super-block of the chunk's activations serves the whole tile
// from L1 (the tiling never changes any output's operation sequence).
constexpr int kKqColTile = 8;

template <class K>
inline void kq_gemm(const uint8_t* w, size_t w_row_bytes, const ActBlock* a, int k, int rows,
                    int n0, int n1, float* out, int ldo) {
  using Acc = typename K::Acc;
  const int nsb = k / kSuper;
  const int nb = k / kBlock;
  thread_local std::vector<KqAct> act;  // [super-block][row of the chunk]
  grow_scratch(act, static_cast<size_t>(nsb) * kRowChunk);
  for (int r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int rc = std::min(rows - r0, kRowChunk);
    for (int r = 0; r < rc; ++r) {
      const ActBlock* ar = a + static_cast<size_t>(r0 + r) * nb;
      for (int sb = 0; sb < nsb; ++sb) {
        kq_prepare<K::kSplit>(ar + sb * kSubBlocks, 1, &act[static_cast<size_t>(sb) * rc + r]);
      }
    }
    const int col_tile = rc >= 4 ? kKqColTile : 1;
    for (int c0 = n0; c0 < n1; c0 += col_tile) {
      const int nc = std::min(col_tile, n1 - c0);
      Acc acc[kKqColTile][kRowChunk];
      for (int c = 0; c < nc; ++c) {
        for (int r = 0; r < rc; ++r) acc[c][r] = Acc{};
      }
      for (int sb = 0; sb < nsb; ++sb) {
        const KqAct* as = &act[static_cast<size_t>(sb) * rc];
        for (int c = 0; c < nc; ++c) {
          typename K::Weights wt;
          const uint8_t* blk =
              w + static_cast<size_t>(c0 + c) * w_row_bytes + static_cast<size_t>(sb) * K::kBytes;
          K::unpack(blk, wt);
          for (int r = 0; r < rc; ++r) acc[c][r] = K::step(wt, as[r], acc[c][r]);
        }
      }
      for (int c = 0; c < nc; ++c) {
        for (int r = 0; r < rc; ++r) {
          out[static_cast<size_t>(r0 + r) * ldo + c0 + c] = kq_finish(acc[c][r]);
        }
      }
    }
  }
}

inline void gemm_q4_k(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0,
                      int n1, float* out, int ldo) {
  kq_gemm<KqQ4K>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q5_k(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0,
                      int n1, float* out, int ldo) {
  kq_gemm<KqQ5K>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q6_k(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0,
                      int n1, float* out, int ldo) {
  kq_gemm<KqQ6K>(w, rb, a, k, rows, n0, n1, out, ldo);
}

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE
