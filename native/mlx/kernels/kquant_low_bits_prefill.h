// Q2_K / Q3_K prompts (many rows) on the x86 paths: Q6_K's prefill kernels run over the GGUF
// rows, expanded on the fly. Included by qgemm_impl.h after kquant_zmm_blocked.h.
//
// Why: the one-row kernels of kquant_low_bits.h spend two multiplies per 64 weights and row
// (maddubs, then the sub-block scale by vpmaddwd) and reach ~50 GMAC/s a Zen 4 core at 128 rows,
// a third of Q6_K's prefill tiles; a 1B Q3_K_M prefill fell below llama.cpp's (AVX2: 88 tok/s
// against 154-177 with Q6_K's tiles).
// Both types are Q6_K's maths on smaller integers: a sub-block of 16 with a signed scale and
// one fp16 d per super-block. A Q3_K weight d * s * (q - 4) is the Q6_K weight of code q + 28
// under the same scale and d; a Q2_K weight d * sc * q - dmin * m is the Q6_K weight of code
// q + 32 under scale sc and d, minus its min term. So each row chunk expands its super-blocks
// into the form the path's Q6_K kernel reads (AVX-512: kb6_tile's Kb6Super; AVX2: dot8_q6k_x's
// scratch), and Q2_K's min term is one more pass (q2k_subtract_mins), 1/16 of the products.
//
// Bit-identical to the one-row kernels: the Q6_K kernels' integer sums are the exact isum of
// kquant_low_bits.h, and their float step is low_bits_step (chosen per path to be theirs);
// q2k_subtract_mins feeds accm the same way and takes acc - accm as LowBitsAcc::result.
#pragma once

#if defined(LLMD_ISA_X86)

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

// The first two steps of a dword transpose of N rows, within 128-bit lanes: u[4g + m] lane L
// holds element 4L + m of rows 4g .. 4g + 3 (the widths differ only in the last step).
template <class V, int N, class Unpack>
inline void dword_quads(const V* x, V* u, Unpack unpack) {
  V t[N];
  for (int i = 0; i < N / 2; ++i) {
    t[2 * i] = unpack.lo32(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = unpack.hi32(x[2 * i], x[2 * i + 1]);
  }
  for (int g = 0; g < N / 4; ++g) {
    u[4 * g] = unpack.lo64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = unpack.hi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = unpack.lo64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = unpack.hi64(t[4 * g + 1], t[4 * g + 3]);
  }
}

#if defined(LLMD_ISA_VNNI)

struct Unpack512 {
  static __m512i lo32(__m512i a, __m512i b) { return _mm512_unpacklo_epi32(a, b); }
  static __m512i hi32(__m512i a, __m512i b) { return _mm512_unpackhi_epi32(a, b); }
  static __m512i lo64(__m512i a, __m512i b) { return _mm512_unpacklo_epi64(a, b); }
  static __m512i hi64(__m512i a, __m512i b) { return _mm512_unpackhi_epi64(a, b); }
};

// In place: afterwards x[k] lane c holds what x[c] lane k held (16 x 16 dwords).
inline void kb_transpose16(__m512i x[16]) {
  __m512i u[16];
  dword_quads<__m512i, 16>(x, u, Unpack512{});
  for (int m = 0; m < 4; ++m) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88);  // lanes 0, 2 of each
    const __m512i v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xdd);  // lanes 1, 3
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xdd);
    x[m] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    x[8 + m] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    x[4 + m] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    x[12 + m] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

template <bool kThree>
struct KbLowBitsKind {
  using Sums = KbSums6;
  using Super = Kb6Super;
  static constexpr int kBlocksPerSum = 1;
  static constexpr bool kRowMajor = true;
  static constexpr int kBytes = kThree ? kQ3KBlockBytes : kQ2KBlockBytes;

  // Super-block sb of the `cols` (<= kKbCols) GGUF rows from w, rb bytes apart, as Kb6Super
  // (columns past `cols` get zero codes, scales and d: their outputs are not stored).
  static void expand(const uint8_t* w, size_t rb, int cols, int sb, Kb6Super& o) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i m4 = _mm512_set1_epi8(4);
    const __m512i offset = _mm512_set1_epi8(kThree ? 28 : 32);
    alignas(64) float d[kKbCols];
    for (int v = 0; v < kKbVecs; ++v) {
      const uint8_t* blk[16];
      __m512i x[16];
      for (int c = 0; c < 16; ++c) {
        const int col = 16 * v + c;
        blk[c] = col < cols ? w + static_cast<size_t>(col) * rb + static_cast<size_t>(sb) * kBytes : nullptr;
        __m128i s = _mm_setzero_si128();
        d[col] = 0.f;
        if (blk[c]) {
          s = kThree ? q3k_scales_simd(blk[c] + 96)
                     : _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[c])), _mm_set1_epi8(0x0f));
          d[col] = half(blk[c] + (kThree ? 108 : 80));
        }
        x[c] = _mm512_cvtepi8_epi32(s);  // lane h: sub-block h's scale
      }
      kb_transpose16(x);  // x[h] lane c: column c's scale of sub-block h = half h % 2 of block h / 2
      for (int h = 0; h < 16; ++h) o.sc[(h / 2) % 2][h / 4][h % 2][v] = x[h];
      o.d[v] = _mm512_load_ps(d + 16 * v);
      for (int j = 0; j < 4; ++j) {
        for (int c = 0; c < 16; ++c) {
          if (!blk[c]) {
            x[c] = _mm512_setzero_si512();
            continue;
          }
          // Bytes 0-31: block j (elements 32j ..), bytes 32-63: block 4 + j, as Q6_K codes.
          const __m512i q = _mm512_loadu_si512(blk[c] + (kThree ? 32 : 16));
          __m512i wq = _mm512_and_si512(j == 0 ? q : _mm512_srli_epi16(q, 2 * j), m3);
          if constexpr (kThree) {
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[c]));
            const __m512i hm = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 4), 1);
            wq = _mm512_mask_add_epi8(wq, _mm512_test_epi8_mask(hm, _mm512_set1_epi8(static_cast<char>(1 << j))), wq,
                                      m4);
          }
          x[c] = _mm512_add_epi8(wq, offset);
        }
        kb_transpose16(x);  // x[t] lane c: column c's dword t of block j; x[8 + t]: of block 4 + j
        for (int t = 0; t < 8; ++t) {
          o.q[j % 2][j / 2][t][v] = x[t];
          o.q[j % 2][2 + j / 2][t][v] = x[8 + t];
        }
      }
    }
  }
};

inline void gemm_q2_k_blocked(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                              float* out, int ldo) {
  if (rows < kKbMinRows) return gemm_q2_k(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kb<KbLowBitsKind<false>>(w, rb, a, k, rows, n0, n1, out, ldo);
  q2k_subtract_mins(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q3_k_blocked(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                              float* out, int ldo) {
  if (rows < kKbMinRows) return gemm_q3_k(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kb<KbLowBitsKind<true>>(w, rb, a, k, rows, n0, n1, out, ldo);
}

#else  // AVX2

struct Unpack256 {
  static __m256i lo32(__m256i a, __m256i b) { return _mm256_unpacklo_epi32(a, b); }
  static __m256i hi32(__m256i a, __m256i b) { return _mm256_unpackhi_epi32(a, b); }
  static __m256i lo64(__m256i a, __m256i b) { return _mm256_unpacklo_epi64(a, b); }
  static __m256i hi64(__m256i a, __m256i b) { return _mm256_unpackhi_epi64(a, b); }
};

// In place: afterwards x[k] lane c holds what x[c] lane k held (8 x 8 dwords).
inline void transpose8_epi32(__m256i x[8]) {
  __m256i u[8];
  dword_quads<__m256i, 8>(x, u, Unpack256{});
  for (int m = 0; m < 4; ++m) {
    x[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
    x[4 + m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
  }
}

// 8 GGUF rows' super-block as dot8_q6k_x's scratch (kquant_avx2_tiles.h): the centred codes
// (Q3_K: q - 4; Q2_K: q), the scales as the kDword tile pairs them, d.
template <bool kThree>
struct LowBitsQ6XExpand {
  static constexpr int kBytes = kThree ? kQ3KBlockBytes : kQ2KBlockBytes;
  static void expand(const uint8_t* group, size_t rb, int /*tile_bytes*/, int sb, uint8_t* s) {
    const uint8_t* blk[8];
    for (int c = 0; c < 8; ++c) blk[c] = group + static_cast<size_t>(c) * rb + static_cast<size_t>(sb) * kBytes;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    for (int n = 0; n < 2; ++n) {
      for (int jj = 0; jj < 4; ++jj) {
        __m256i x[8];  // column c's block 4n + jj (elements 128n + 32jj ..)
        for (int c = 0; c < 8; ++c) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[c] + (kThree ? 32 : 16) + 32 * n));
          __m256i wq = _mm256_and_si256(jj == 0 ? q : _mm256_srli_epi16(q, 2 * jj), m3);
          if constexpr (kThree) {
            const int bit = 4 * n + jj;  // hmask bit, moved to bit 2
            const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[c]));
            const __m256i h = bit <= 2 ? _mm256_slli_epi16(hm, 2 - bit) : _mm256_srli_epi16(hm, bit - 2);
            wq = _mm256_sub_epi8(_mm256_or_si256(wq, _mm256_and_si256(h, m4)), m4);
          }
          x[c] = wq;
        }
        transpose8_epi32(x);  // x[i] lane c: column c's elements 4i .. 4i + 3 of the block
        for (int i = 0; i < 8; ++i) store32(s + 256 * (4 * n + jj) + 32 * i, x[i]);
      }
    }
    alignas(16) uint8_t pairs[kSubBlocks][16];
    alignas(16) uint16_t d16[8];
    for (int c = 0; c < 8; ++c) {
      alignas(16) uint8_t sc[16];
      const __m128i v = kThree ? q3k_scales_simd(blk[c] + 96)
                               : _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[c])),
                                               _mm_set1_epi8(0x0f));
      _mm_store_si128(reinterpret_cast<__m128i*>(sc), v);
      for (int j = 0; j < kSubBlocks; ++j) {
        pairs[j][2 * c] = sc[2 * j];
        pairs[j][2 * c + 1] = sc[2 * j + 1];
      }
      d16[c] = read_u16(blk[c] + (kThree ? 108 : 80));
    }
    q6x_scales(&pairs[0][0], reinterpret_cast<const uint8_t*>(d16), s);
  }
};

// Up to kPackedRowsQ56K rows keep the row-major kernels (as Q6_K keeps its packed ones); columns
// past the last whole group of 8 too.
template <bool kThree>
inline void gemm_low_bits_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                   float* out, int ldo) {
  if (rows <= kPackedRowsQ56K) return gemm_low_bits<kThree>(w, rb, a, k, rows, n0, n1, out, ldo);
  const int n8 = n0 + (n1 - n0) / 8 * 8;
  gemm_kq_expanded<kExpandedRows, 1, kQ6XBytes, Q6XRows, LowBitsQ6XExpand<kThree>, Q6X>(w, rb, a, k, rows, n0, n8,
                                                                                        out, ldo, 0);
  if constexpr (!kThree) q2k_subtract_mins(w, rb, a, k, rows, n0, n8, out, ldo);
  if (n8 < n1) gemm_low_bits<kThree>(w, rb, a, k, rows, n8, n1, out, ldo);
}
inline void gemm_q2_k_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                               float* out, int ldo) {
  gemm_low_bits_expanded<false>(w, rb, a, k, rows, n0, n1, out, ldo);
}
inline void gemm_q3_k_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                               float* out, int ldo) {
  gemm_low_bits_expanded<true>(w, rb, a, k, rows, n0, n1, out, ldo);
}

#endif

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE

#endif
