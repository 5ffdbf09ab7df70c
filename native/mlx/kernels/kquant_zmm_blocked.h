// Register-blocked Q4_K / Q5_K / Q6_K prefill kernels on 512-bit vectors (AVX-512 VNNI path).
// Included by qgemm_impl.h after kquant_impl.h, whose one-row kernels (decode: gemm_q*_k_x8)
// these must match bit for bit and fall back to below kKbMinRows.
//
// Why: the 8-column kernels of kquant_impl.h issue one activation load and qword broadcast per
// vpdpbusd (a tile's weight vector meets each of its rows once), and that, not the unpacking,
// is what a prefill product pays for (bench/README.md, issue 31: with one activation register
// shared by all rows a copy of the Q5_K kernel went 278 -> 378-388 GMAC/s). Here a weight
// vector is 16 columns x 4 elements of ONE sub-block, so one activation dword broadcast serves
// every column vector of the tile, and each weight vector serves kKbRows rows: a 4-row x
// 2-vector tile keeps 8 int32 chains in registers and issues 8 vpdpbusd per 2 weight loads
// and 4 broadcasts. Those vectors do not exist in the packed tile (8 columns x 2 sub-blocks, 4
// bits a weight), so each call expands the weights it needs, per row chunk and a few
// super-blocks at a time, into a byte-per-weight scratch (Q5_K's fifth and Q6_K's high two bits
// merged there once for the whole chunk's rows); the RSS target leaves no room for an expanded
// copy made at load time.
//
// Bit-identical to the one-row kernels: per (row, column) the integer sums are exact (so their
// order is free: a super-block's sub-blocks of both parities meet in int32) and the float
// operations are those of dot8_q45k_zmm / dot8_q6k_zmm in the same order: one accumulator fed
// super-block by super-block with the same fma/fmsub/mul expressions.
#pragma once

#if defined(LLMD_ISA_VNNI)

#include <unistd.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

// Tile and blocking sizes, each the fastest of those tried in bench/kquant_kernel_bench.cpp
// (512 x 2048 x 2048 and x 8192, one Zen 5 core, quiet; bench/README.md, issue 31): 4 rows x 2
// vectors (16 int32 chains; 6 x 2 tied at k = 2048 and lost 10% at 8192, 5 x 2 in between; 5 and
// 6 rows lost on Zen 4 too), slabs of super-blocks that fit the core's L1 (kb_slab) and row
// chunks of 192 (the chunk's activations stay in L2; larger chunks were slower at k = 2048;
// kb_chunk_rows takes fewer at large k).
constexpr int kKbRows = 4;                  // activation rows per register tile
constexpr int kKbVecs = 2;                  // 16-column vectors per register tile
constexpr int kKbCols = 16 * kKbVecs;       // columns per block of expanded weights (4 groups)
constexpr int kKbGroups = kKbCols / 8;
constexpr int kKbMaxSlab = 4;               // super-blocks expanded at a time, at most

// Super-blocks expanded at a time: every row tile of a chunk rereads them, so they should sit in
// L1. A Q4_K / Q5_K super-block of kKbCols columns expands to ~10 KiB (Q6_K's ~9): 4 of them
// fit a 48 KiB L1 (Zen 5: 2 and 3 were slower there), 2 a 32 KiB one (Zen 4: 4 ran slower
// than 2: 0-9% at 512 x 2048 x 2048, 5-13% at x 8192, and 2 gave a 512-token Q5_K_M prefill +3%).
inline int kb_slab() {
  static const int slab = [] {
    const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return l1 > 0 && l1 < (48 << 10) ? 2 : kKbMaxSlab;
  }();
  return slab;
}
constexpr int kKbChunk = 192;               // activation rows per chunk, at most
// ... and fewer where the chunk's activations (40 bytes per 32 of k) would outgrow this share of
// the core's L2: every block of columns rereads them. At k = 8192 (ffn_down) 192 rows are 1.9
// MiB; 64 rows ran 5-8% faster there (Q5_K 277 -> 285-298, Q6_K 234 -> 249-254 GMAC/s, the
// engine's column tasks, one Zen 5 core, quiet), while at k = 2048 larger chunks were slower.
constexpr int kKbChunkBytes = 640 << 10;
constexpr int kKbMinChunk = 64;

inline int kb_chunk_rows(int k) {
  const int fit = kKbChunkBytes / (k / kBlock * static_cast<int>(sizeof(ActBlock))) / kKbRows * kKbRows;
  return std::clamp(fit, kKbMinChunk, kKbChunk);
}

// Q4_K / Q5_K super-block of kKbCols columns, expanded. q[e][p][t][v]: dword c of vector v is
// column 16v + c's elements 4t .. 4t + 3 of sub-block 2p + e (fifth bit merged), so a sub-block
// is 8 consecutive steps t; sc: lane c the sub-block's 6-bit scale; mn[e][h][v]: lane c the
// int16 pair (m[4h + e], m[4h + e + 2]), the vpdpwssd operand against KqSuper::bsum's dword
// 2h + e; d, dmin: lane c the column's fp16 scales.
struct alignas(64) Kb45Super {
  __m512i q[2][4][8][kKbVecs];
  __m512i sc[2][4][kKbVecs];
  __m512i mn[2][2][kKbVecs];
  __m512 d[kKbVecs];
  __m512 dmin[kKbVecs];
};

// Q6_K super-block of kKbCols columns, expanded: q as Kb45Super's (q in [0, 63], the chains
// seeded with -32 * sum(a)), sc[e][p][hf][v]: lane c column 16v + c's int8 scale of half hf of
// block 2p + e; d: lane c the column's fp16 scale.
struct alignas(64) Kb6Super {
  __m512i q[2][4][8][kKbVecs];
  __m512i sc[2][4][2][kKbVecs];
  __m512 d[kKbVecs];
};

// The two groups' int32 lanes 2c + e (8 columns x 2 sub-blocks each) regrouped into one
// sub-block's 16 columns: e = 0 takes the even lanes, e = 1 the odd.
inline __m512i kb_columns(__m512i a, __m512i b, int e) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_permutex2var_epi32(a, e == 0 ? even : odd, b);
}

// 8 bytes of group A then 8 of group B, widened to int32 lanes.
inline __m512i kb_bytes16(const uint8_t* a, const uint8_t* b) {
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi));
}

// 8 fp16 of group A then 8 of group B.
inline __m512 kb_halves16(const uint8_t* a, const uint8_t* b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// Super-block `sb` of `ng` (1 .. 4) packed groups starting at w (stride bytes apart); the
// lanes of missing groups get zero weights and scales (their outputs are not stored).
template <bool kFive>
inline void kb45_expand(const uint8_t* w, size_t stride, int ng, int sb, Kb45Super& o) {
  constexpr int kTile = 8 * (kFive ? kQ5KBytes : kQ4KBytes);
  alignas(64) static constexpr uint8_t kZero[kTile] = {};
  const uint8_t* t[kKbGroups];
  for (int g = 0; g < kKbGroups; ++g) t[g] = g < ng ? w + g * stride + static_cast<size_t>(sb) * kTile : kZero;
  // The 6-bit scales and mins as bytes 8j + c (as dot8_q45k_zmm decodes them).
  alignas(32) uint8_t sc[kKbGroups][64], mn[kKbGroups][64];
  const __m256i m4y = _mm256_set1_epi8(0x0f);
  const __m256i m30y = _mm256_set1_epi8(0x30);
  for (int g = 0; g < kKbGroups; ++g) {
    const __m256i lo0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t[g] + 32));
    const __m256i lo1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t[g] + 64));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t[g] + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc[g]),
                       _mm256_or_si256(_mm256_and_si256(lo0, m4y), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30y)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc[g] + 32),
                       _mm256_or_si256(_mm256_and_si256(lo1, m4y), _mm256_and_si256(hb, m30y)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(mn[g]), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m4y),
                                                                          _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30y)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(mn[g] + 32), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4y),
                                                                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30y)));
  }
  for (int v = 0; v < kKbVecs; ++v) {
    const int ga = 2 * v, gb = 2 * v + 1;
    o.d[v] = kb_halves16(t[ga], t[gb]);
    o.dmin[v] = kb_halves16(t[ga] + 16, t[gb] + 16);
    for (int j = 0; j < kSubBlocks; ++j) o.sc[j & 1][j >> 1][v] = kb_bytes16(sc[ga] + 8 * j, sc[gb] + 8 * j);
    for (int e = 0; e < 2; ++e) {
      for (int h = 0; h < 2; ++h) {
        const int j = 4 * h + e;
        o.mn[e][h][v] = _mm512_or_si512(kb_bytes16(mn[ga] + 8 * j, mn[gb] + 8 * j),
                                        _mm512_slli_epi32(kb_bytes16(mn[ga] + 8 * j + 16, mn[gb] + 8 * j + 16), 16));
      }
    }
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i v16 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
      __m512i lo[kKbGroups], hi[kKbGroups];
#pragma GCC unroll 4
      for (int g = 0; g < kKbGroups; ++g) {
        // As dot8_q45k_zmm unpacks a slice: lanes 2c + e hold steps 2s (lo) and 2s + 1 (hi).
        const __m512i q = _mm512_loadu_si512(t[g] + 128 + 256 * p + 64 * s);
        lo[g] = _mm512_and_si512(q, m4);
        hi[g] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if constexpr (kFive) {
          const uint8_t* mk = t[g] + 1152 + 64 * p + 16 * s;
          lo[g] = _mm512_mask_add_epi8(lo[g], _cvtu64_mask64(load_u64(mk)), lo[g], v16);
          hi[g] = _mm512_mask_add_epi8(hi[g], _cvtu64_mask64(load_u64(mk + 8)), hi[g], v16);
        }
      }
#pragma GCC unroll 2
      for (int v = 0; v < kKbVecs; ++v) {
        for (int e = 0; e < 2; ++e) {
          o.q[e][p][2 * s][v] = kb_columns(lo[2 * v], lo[2 * v + 1], e);
          o.q[e][p][2 * s + 1][v] = kb_columns(hi[2 * v], hi[2 * v + 1], e);
        }
      }
    }
  }
}

inline void kb6_expand(const uint8_t* w, size_t stride, int ng, int sb, Kb6Super& o) {
  constexpr int kTile = 8 * kQ6KBytes;
  alignas(64) static constexpr uint8_t kZero[kTile] = {};
  const uint8_t* t[kKbGroups];
  for (int g = 0; g < kKbGroups; ++g) t[g] = g < ng ? w + g * stride + static_cast<size_t>(sb) * kTile : kZero;
  for (int v = 0; v < kKbVecs; ++v) {
    const uint8_t* ta = t[2 * v];
    const uint8_t* tb = t[2 * v + 1];
    o.d[v] = kb_halves16(ta, tb);  // lane c: column 16v + c's d
    for (int p = 0; p < 4; ++p) {
      for (int hf = 0; hf < 2; ++hf) {
        // Lanes 2c + e of each group, as dot8_q6k_zmm loads them, regrouped by sub-block.
        const int off = 16 + 32 * p + 16 * hf;
        const __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta + off)));
        const __m512i sbv = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tb + off)));
        for (int e = 0; e < 2; ++e) o.sc[e][p][hf][v] = kb_columns(sa, sbv, e);
      }
    }
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) {
#pragma GCC unroll 2
      for (int v = 0; v < 2; ++v) {
        const int sl = 2 * u + v;
        __m512i lo[kKbGroups], hi[kKbGroups];
#pragma GCC unroll 4
        for (int g = 0; g < kKbGroups; ++g) {
          // As dot8_q6k_zmm unpacks slice sl: lanes 2c + e hold steps 2sl (lo) and 2sl + 1 (hi).
          const __m512i qh = _mm512_loadu_si512(t[g] + 1168 + 128 * p + 64 * u);
          const __m512i ql = _mm512_loadu_si512(t[g] + 144 + 256 * p + 64 * sl);
          const __m512i hlo = v == 0 ? _mm512_slli_epi16(qh, 4) : qh;
          const __m512i hhi = v == 0 ? _mm512_slli_epi16(qh, 2) : _mm512_srli_epi16(qh, 2);
          lo[g] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(hlo, m30));
          hi[g] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(hhi, m30));
        }
#pragma GCC unroll 2
        for (int c = 0; c < kKbVecs; ++c) {
          for (int e = 0; e < 2; ++e) {
            o.q[e][p][2 * sl][c] = kb_columns(lo[2 * c], lo[2 * c + 1], e);
            o.q[e][p][2 * sl + 1][c] = kb_columns(hi[2 * c], hi[2 * c + 1], e);
          }
        }
      }
    }
  }
}

inline __m512i kb_bcast(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// The kernels read a row's activations where the quantizer wrote them (ActBlocks, one dword
// broadcast at a time, never across a cache line) and take the integer block sums they need from
// a small per-chunk table. Why not kquant_impl.h's KqSuperRows / KqPairRows: those copy every
// row's quants into an interleaved layout on each call, and the engine calls a product once per
// column task (about 15 per op, each over all the prompt's rows): in a copy of the driver that
// ran the tasks one after another the copies cost 6% of a 512 x 2048 x 2048 product.
struct KbSums45 {
  int16_t bsum[kSubBlocks];  // per super-block, in KqSuper::bsum's order (vpdpwssd operands of the mins)
};
struct KbSums6 {
  int32_t seed[2];  // per block: -32 * the sum of each 16-element half (Q6_K's q - 32), as KqPair::seed
};
template <class Sums>
struct KbRow {
  const ActBlock* q;  // the row's blocks
  const Sums* sums;   // per super-block (Q4_K / Q5_K) or block (Q6_K)
};

// Block b's quants summed by dwords (lane i: bytes 4i .. 4i + 3).
inline __m256i kb_sums8(const ActBlock& b) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.q)));
}

// Blocks i0 .. i3 by halves: lane j the sum of block i_j's first 16 quants, lane 4 + j of its last 16.
inline __m256i kb_halves4(const ActBlock* b, int i0, int i1, int i2, int i3) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(kb_sums8(b[i0]), kb_sums8(b[i1])),
                           _mm256_hadd_epi32(kb_sums8(b[i2]), kb_sums8(b[i3])));
}

// One row's block sums, exact integers: the same values KqSuperRows / KqPairRows compute.
inline void kb_row_sums(const ActBlock* b, int nb, KbSums45* o) {
  for (int sb = 0; sb < nb / kSubBlocks; ++sb, b += kSubBlocks) {
    // bsum's order: blocks 0, 2, 1, 3, then 4, 6, 5, 7.
    const __m256i g0 = kb_halves4(b, 0, 2, 1, 3);
    const __m256i g1 = kb_halves4(b, 4, 6, 5, 7);
    const __m128i s0 = _mm_add_epi32(_mm256_castsi256_si128(g0), _mm256_extracti128_si256(g0, 1));
    const __m128i s1 = _mm_add_epi32(_mm256_castsi256_si128(g1), _mm256_extracti128_si256(g1, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o[sb].bsum), _mm_packs_epi32(s0, s1));  // |sum| <= 32 * 127
  }
}
inline void kb_row_sums(const ActBlock* b, int nb, KbSums6* o) {
  const __m128i z = _mm_setzero_si128();
  for (int i = 0; i < nb; i += 4) {
    const __m256i g = kb_halves4(b + i, 0, 1, 2, 3);
    const __m128i lo = _mm256_castsi256_si128(g), hi = _mm256_extracti128_si256(g, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm_sub_epi32(z, _mm_slli_epi32(_mm_unpacklo_epi32(lo, hi), 5)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i + 2),
                     _mm_sub_epi32(z, _mm_slli_epi32(_mm_unpackhi_epi32(lo, hi), 5)));
  }
}

// R rows x G vectors over super-blocks [sb0, sb1) of the expanded weights ws (indexed from
// sb0). acc[r][g]: the float accumulator, carried between slabs. Per
// super-block: the 8 sub-blocks' exact integer dots, scaled in int32 and summed over both
// parities (isc); the mins' int32 sum (imin); then acc = fma(isc * d - imin * dmin, a.d, acc) as
// dot8_q45k_zmm.
template <int R, int G>
inline void kb45_tile(const Kb45Super* ws, const KbRow<KbSums45>* a, int sb0, int sb1, __m512 (*acc)[kKbVecs]) {
  for (int sb = sb0; sb < sb1; ++sb) {
    const Kb45Super& w = ws[sb - sb0];
    __m512i isc[R][G];
#pragma GCC unroll 2
    for (int e = 0; e < 2; ++e) {
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        __m512i ch[R][G];
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
          __m512i wv[G];
#pragma GCC unroll 2
          for (int g = 0; g < G; ++g) wv[g] = _mm512_load_si512(&w.q[e][p][t][g]);
#pragma GCC unroll 6
          for (int r = 0; r < R; ++r) {
            const __m512i av = kb_bcast(a[r].q[sb * kSubBlocks + 2 * p + e].q + 4 * t);
#pragma GCC unroll 2
            for (int g = 0; g < G; ++g) {
              ch[r][g] = _mm512_dpbusd_epi32(t == 0 ? _mm512_setzero_si512() : ch[r][g], wv[g], av);
            }
          }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
          for (int g = 0; g < G; ++g) {
            const __m512i v = _mm512_mullo_epi32(ch[r][g], w.sc[e][p][g]);
            isc[r][g] = e == 0 && p == 0 ? v : _mm512_add_epi32(isc[r][g], v);
            // Here, not after the last sub-block: GCC otherwise sinks the products to the end
            // of the super-block and spills the sub-blocks' chains to the stack meanwhile.
            asm volatile("" : "+v"(isc[r][g]));
          }
        }
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const int16_t* bsum = a[r].sums[sb].bsum;
      const __m512i b00 = kb_bcast(bsum), b10 = kb_bcast(bsum + 4);
      const __m512i b01 = kb_bcast(bsum + 2), b11 = kb_bcast(bsum + 6);
      const __m512 ad = _mm512_set1_ps(a[r].q[sb * kSubBlocks].d);
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) {
        __m512i imin = _mm512_dpwssd_epi32(_mm512_madd_epi16(w.mn[0][0][g], b00), w.mn[0][1][g], b10);
        imin = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(imin, w.mn[1][0][g], b01), w.mn[1][1][g], b11);
        const __m512 x =
            _mm512_fmsub_ps(_mm512_cvtepi32_ps(isc[r][g]), w.d[g], _mm512_mul_ps(_mm512_cvtepi32_ps(imin), w.dmin[g]));
        acc[r][g] = _mm512_fmadd_ps(x, ad, acc[r][g]);
      }
    }
  }
}

// Q6_K: per block 2p + e and half hf, the exact integer dot of q - 32 (chains seeded with
// -32 * sum(a)) times the half's int8 scale, summed over the super-block in int32 (isc); then
// acc = fma(isc * d, a.d, acc) as dot8_q6k_zmm, super-block by super-block.
template <int R, int G>
inline void kb6_tile(const Kb6Super* ws, const KbRow<KbSums6>* a, int sb0, int sb1, __m512 (*acc)[kKbVecs]) {
  for (int sb = sb0; sb < sb1; ++sb) {
    const Kb6Super& w = ws[sb - sb0];
    __m512i isc[R][G];
#pragma GCC unroll 2
    for (int e = 0; e < 2; ++e) {
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const int pi = sb * (kSubBlocks / 2) + p;
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
          __m512i ch[R][G];
#pragma GCC unroll 6
          for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
            for (int g = 0; g < G; ++g) ch[r][g] = kb_bcast(&a[r].sums[2 * pi + e].seed[hf]);
          }
#pragma GCC unroll 4
          for (int t = 4 * hf; t < 4 * hf + 4; ++t) {
            __m512i wv[G];
#pragma GCC unroll 2
            for (int g = 0; g < G; ++g) wv[g] = _mm512_load_si512(&w.q[e][p][t][g]);
#pragma GCC unroll 6
            for (int r = 0; r < R; ++r) {
              const __m512i av = kb_bcast(a[r].q[2 * pi + e].q + 4 * t);
#pragma GCC unroll 2
              for (int g = 0; g < G; ++g) ch[r][g] = _mm512_dpbusd_epi32(ch[r][g], wv[g], av);
            }
          }
#pragma GCC unroll 6
          for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
            for (int g = 0; g < G; ++g) {
              const __m512i v = _mm512_mullo_epi32(ch[r][g], w.sc[e][p][hf][g]);
              isc[r][g] = e == 0 && p == 0 && hf == 0 ? v : _mm512_add_epi32(isc[r][g], v);
              asm volatile("" : "+v"(isc[r][g]));  // as kb45_tile: keeps the products in place
            }
          }
        }
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 ad = _mm512_set1_ps(a[r].q[sb * kSubBlocks].d);
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) {
        acc[r][g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isc[r][g]), w.d[g]), ad, acc[r][g]);
      }
    }
  }
}

// What gemm_kb runs: the expanded super-block type, the activation sums its tile reads, and
// whether the weights are packed groups (kRowMajor: GGUF rows, expanded by Kind::expand; see
// kquant_low_bits_prefill.h).
struct Kb45Kind {
  using Sums = KbSums45;
  using Super = Kb45Super;
  static constexpr int kBlocksPerSum = kSubBlocks;
  static constexpr bool kRowMajor = false;
};
struct Kb6Kind {
  using Sums = KbSums6;
  using Super = Kb6Super;
  static constexpr int kBlocksPerSum = 1;
  static constexpr bool kRowMajor = false;
};

// Bytes of one packed group's super-block (8 columns), as the expansions read them.
template <class Kind, bool kFive>
constexpr int kb_tile_bytes() {
  return 8 * (std::is_same_v<typename Kind::Super, Kb6Super> ? kQ6KBytes : kFive ? kQ5KBytes : kQ4KBytes);
}

template <class Kind, bool kFive>
inline void kb_expand(const uint8_t* w, size_t stride, int ng, int sb, typename Kind::Super& o) {
  if constexpr (std::is_same_v<Kind, Kb6Kind>) {
    kb6_expand(w, stride, ng, sb, o);
  } else {
    kb45_expand<kFive>(w, stride, ng, sb, o);
  }
}

template <class Kind, int R, int G>
inline void kb_tile(const typename Kind::Super* ws, const KbRow<typename Kind::Sums>* a, int sb0, int sb1,
                    __m512 (*acc)[kKbVecs]) {
  if constexpr (std::is_same_v<typename Kind::Super, Kb6Super>) {
    kb6_tile<R, G>(ws, a, sb0, sb1, acc);
  } else {
    kb45_tile<R, G>(ws, a, sb0, sb1, acc);
  }
}

// A tile of n (1 .. kKbRows) rows as a call with a compile-time row count.
template <class Kind, int G, int kMax = kKbRows>
inline void kb_run_tile(int n, const typename Kind::Super* ws, const KbRow<typename Kind::Sums>* a, int sb0, int sb1,
                        __m512 (*acc)[kKbVecs]) {
  if constexpr (kMax > 1) {
    if (n < kMax) return kb_run_tile<Kind, G, kMax - 1>(n, ws, a, sb0, sb1, acc);
  }
  kb_tile<Kind, kMax, G>(ws, a, sb0, sb1, acc);
}

// Rows below which a product keeps the 8-column kernels: the expansion is paid once per row
// chunk and does not pay off over a few sequences' decode rows (16 rows of Q5_K: 274 -> 230
// GMAC/s; 32: equal; 48: 300 -> 316, Q6_K 258 -> 306).
constexpr int kKbMinRows = 48;

// Packed groups of 8 weight rows, [n0, n1) multiples of 8 (any columns for a kRowMajor kind),
// rows >= kKbMinRows. Per chunk of
// activation rows (kb_chunk_rows) and block of kKbCols columns: super-blocks
// are expanded kb_slab() at a time, and every row tile of the chunk runs over them, carrying its
// accumulators (accs) from slab to slab.
template <class Kind, bool kFive = false>
inline void gemm_kb(const uint8_t* w, size_t w_row_bytes, const ActBlock* a, int k, int rows, int n0, int n1,
                    float* out, int ldo) {
  using Sums = typename Kind::Sums;
  using Super = typename Kind::Super;
  const int nb = k / kBlock;
  const int nsb = k / kSuper;
  const size_t stride = 8 * w_row_bytes;
  const int row_sums = nb / Kind::kBlocksPerSum;
  constexpr int kTileBytes = kb_tile_bytes<Kind, kFive>();
  // The per-thread scratch is reached through plain pointers: every use of a thread_local
  // in this shared object is a __tls_get_addr call, which GCC does not hoist past the tile
  // calls (the output loop around such a call held a third of this driver's own samples in a
  // Q5_K_M prefill; no change end to end was measurable on Zen 4).
  thread_local std::vector<Sums> sums_buf;
  Sums* const sums = grow_scratch(sums_buf, static_cast<size_t>(kKbChunk) * row_sums);
  const int chunk = kb_chunk_rows(k);
  constexpr int kRows = kKbRows;
  thread_local std::vector<Super> ws_buf;
  Super* const ws = grow_scratch(ws_buf, kKbMaxSlab);
  const int slab = kb_slab();
  struct alignas(64) TileAcc {
    __m512 v[kKbRows][kKbVecs];
  };
  thread_local std::vector<TileAcc> accs_buf;
  TileAcc* const accs = grow_scratch(accs_buf, static_cast<size_t>((chunk + kRows - 1) / kRows));
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int r1 = std::min(rows, r0 + chunk);
    const int tiles = (r1 - r0 + kRows - 1) / kRows;
    for (int r = r0; r < r1; ++r) {
      kb_row_sums(a + static_cast<size_t>(r) * nb, nb, sums + static_cast<size_t>(r - r0) * row_sums);
    }
    for (int n = n0; n < n1; n += kKbCols) {
      const int cols = std::min(kKbCols, n1 - n);
      const int ng = (cols + 7) / 8;
      const uint8_t* group = w + static_cast<size_t>(n) * w_row_bytes;
      for (int i = 0; i < tiles; ++i) {
        for (auto& x : accs[i].v) {
          for (auto& y : x) y = _mm512_setzero_ps();
        }
      }
      for (int sb0 = 0; sb0 < nsb; sb0 += slab) {
        const int sb1 = std::min(nsb, sb0 + slab);
        for (int sb = sb0; sb < sb1; ++sb) {
          if constexpr (Kind::kRowMajor) {
            Kind::expand(group, w_row_bytes, cols, sb, ws[sb - sb0]);
          } else {
            kb_expand<Kind, kFive>(group, stride, ng, sb, ws[sb - sb0]);
          }
        }
        // The packed weights the next expansion reads (this block's next slab, else the next
        // block's first), asked for a few lines per row tile while this slab's tiles run: the
        // expansion is where a weight first arrives from memory, and it waited there.
        const bool last_slab = sb1 == nsb;
        const int next_slab = last_slab ? std::min(slab, nsb) : std::min(slab, nsb - sb1);
        // Packed: groups of 8 rows, a tile per super-block. GGUF rows (kRowMajor): each row's run
        // of the next slab's blocks, one line more for where the run starts in a line.
        const uint8_t* next;
        size_t unit_stride;
        int units, unit_lines;
        if constexpr (Kind::kRowMajor) {
          next = last_slab ? group + kKbCols * w_row_bytes : group + static_cast<size_t>(sb1) * Kind::kBytes;
          unit_stride = w_row_bytes;
          units = last_slab ? std::min(kKbCols, n1 - n - kKbCols) : cols;
          unit_lines = (next_slab * Kind::kBytes + 63) / 64 + 1;
        } else {
          next = last_slab ? group + kKbGroups * stride : group + static_cast<size_t>(sb1) * kTileBytes;
          unit_stride = stride;
          units = last_slab ? std::min(kKbGroups, (n1 - n - kKbCols) / 8) : ng;
          unit_lines = next_slab * kTileBytes / 64;
        }
        const int lines = std::max(units, 0) * unit_lines;
        const int per_tile = (lines + tiles - 1) / tiles;
        int line = 0;
        for (int i = 0; i < tiles; ++i) {
          for (const int e = std::min(lines, line + per_tile); line < e; ++line) {
            __builtin_prefetch(next + line / unit_lines * unit_stride + static_cast<size_t>(line % unit_lines) * 64);
          }
          const int r = r0 + i * kRows;
          const int t_rows = std::min(kRows, r1 - r);
          KbRow<Sums> rows_a[kKbRows];
          for (int t = 0; t < t_rows; ++t) {
            rows_a[t] = {a + static_cast<size_t>(r + t) * nb, sums + static_cast<size_t>(r + t - r0) * row_sums};
          }
          if (ng > 2) {
            kb_run_tile<Kind, 2>(t_rows, ws, rows_a, sb0, sb1, accs[i].v);
          } else {
            kb_run_tile<Kind, 1>(t_rows, ws, rows_a, sb0, sb1, accs[i].v);
          }
        }
      }
      for (int i = 0; i < tiles; ++i) {
        const int r = r0 + i * kRows;
        const int t_rows = std::min(kRows, r1 - r);
        for (int t = 0; t < t_rows; ++t) {
          float* o = out + static_cast<size_t>(r + t) * ldo + n;
          for (int v = 0; v < (ng + 1) / 2; ++v) {
            const __mmask16 keep = static_cast<__mmask16>((1u << std::min(16, cols - 16 * v)) - 1);
            _mm512_mask_storeu_ps(o + 16 * v, keep, accs[i].v[t][v]);
          }
        }
      }
    }
  }
}

inline void gemm_q4_k_x8_blocked(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                 float* out, int ldo) {
  if (rows < kKbMinRows) return gemm_q4_k_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kb<Kb45Kind, false>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q5_k_x8_blocked(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                 float* out, int ldo) {
  if (rows < kKbMinRows) return gemm_q5_k_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kb<Kb45Kind, true>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q6_k_x8_blocked(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                 float* out, int ldo) {
  if (rows < kKbMinRows) return gemm_q6_k_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kb<Kb6Kind>(w, rb, a, k, rows, n0, n1, out, ldo);
}

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE

#endif
