// Q2_K / Q3_K prefill on the AVX-512 path: Q6_K's register-blocked tile (kquant_zmm_blocked.h)
// run over the GGUF rows, expanded on the fly. Included by qgemm_impl.h after
// kquant_zmm_blocked.h.
//
// Why: the one-row kernels of kquant_low_bits.h spend two multiplies per 64 weights and row
// (maddubs, then the sub-block scale by vpdpwssd) and reach ~50 GMAC/s a core at 128 rows, a
// third of the blocked Q6_K tile; a 1B Q3_K_M prefill would fall below llama.cpp's.
// Both types are Q6_K's maths on smaller integers: a sub-block of 16 with a signed scale and
// one fp16 d per super-block. A Q3_K weight d * s * (q - 4) is the Q6_K weight of code q + 28
// under the same scale and d; a Q2_K weight d * sc * q - dmin * m is the Q6_K weight of code
// q + 32 under scale sc and d, minus its min term. So each row chunk expands its super-blocks
// into Q6_K's expanded form (Kb6Super) and kb6_tile runs them; Q2_K's min term is one more
// pass (q2k_subtract_mins), 1/16 of the products.
//
// Bit-identical to the one-row kernels: kb6_tile's integer sums are the exact isum of
// kquant_low_bits.h, and its float step (acc = fma(float(isum) * d, a.d, acc), super-block by
// super-block) is LowBitsAcc::step's; q2k_subtract_mins feeds accm the same way and takes
// acc - accm as LowBitsAcc::result.
#pragma once

#if defined(LLMD_ISA_VNNI)

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

// In place: afterwards x[k] lane c holds what x[c] lane k held (16 x 16 dwords).
inline void kb_transpose16(__m512i x[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
  }
  // u[4g + m], 128-bit lane L: rows 4g .. 4g + 3, element 4L + m.
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
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

// Sub-block sums of activation rows: out[16 * (row * nsb + sb) + h], h the 16-element sub-block.
inline void low_bits_row_sums(const ActBlock* b, int nb, int16_t* out) {
  for (int i = 0; i < nb; i += 4) {
    const __m256i g = kb_halves4(b + i, 0, 1, 2, 3);  // lane j: block i + j's first half, 4 + j: its second
    const __m128i lo = _mm256_castsi256_si128(g), hi = _mm256_extracti128_si256(g, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm_packs_epi32(_mm_unpacklo_epi32(lo, hi), _mm_unpackhi_epi32(lo, hi)));
  }
}

// out -= Q2_K's min term for rows x [n0, n1): per (row, column) accm = fma(float(imin) * dmin,
// a.d, accm) super-block by super-block, as LowBitsAcc, with imin = sum_h m_h * sum(a_h).
// Vectorized over 16 columns: dword hp of a column's super-block is its (m_2hp, m_2hp+1) pair.
inline void q2k_subtract_mins(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                              float* out, int ldo) {
  const int nsb = k / kSuper, nb = k / kBlock;
  thread_local std::vector<int16_t> sums_buf;
  int16_t* const sums = grow_scratch(sums_buf, static_cast<size_t>(rows) * nsb * 16);
  for (int r = 0; r < rows; ++r) {
    low_bits_row_sums(a + static_cast<size_t>(r) * nb, nb, sums + static_cast<size_t>(r) * nsb * 16);
  }
  thread_local std::vector<int32_t> mins_buf;
  thread_local std::vector<float> dmin_buf;
  int32_t* const mins = grow_scratch(mins_buf, static_cast<size_t>(nsb) * 8 * 16);  // [sb][pair][column]
  float* const dmin = grow_scratch(dmin_buf, static_cast<size_t>(nsb) * 16);       // [sb][column]
  for (int n = n0; n < n1; n += 16) {
    const int cols = std::min(16, n1 - n);
    for (int sb = 0; sb < nsb; ++sb) {
      for (int c = 0; c < 16; ++c) {
        const uint8_t* blk = w + static_cast<size_t>(n + c) * rb + static_cast<size_t>(sb) * kQ2KBlockBytes;
        for (int hp = 0; hp < 8; ++hp) {
          mins[(sb * 8 + hp) * 16 + c] = c < cols ? (blk[2 * hp] >> 4) | ((blk[2 * hp + 1] >> 4) << 16) : 0;
        }
        dmin[sb * 16 + c] = c < cols ? half(blk + 82) : 0.f;
      }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1);
    for (int r = 0; r < rows; ++r) {
      const int16_t* rs = sums + static_cast<size_t>(r) * nsb * 16;
      __m512 accm = _mm512_setzero_ps();
      for (int sb = 0; sb < nsb; ++sb) {
        __m512i imin = _mm512_setzero_si512();
        for (int hp = 0; hp < 8; ++hp) {
          imin = _mm512_dpwssd_epi32(imin, _mm512_loadu_si512(mins + (sb * 8 + hp) * 16), kb_bcast(rs + 16 * sb + 2 * hp));
        }
        const __m512 ad = _mm512_set1_ps(a[static_cast<size_t>(r) * nb + sb * kSubBlocks].d);
        accm = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(imin), _mm512_loadu_ps(dmin + sb * 16)), ad, accm);
      }
      float* o = out + static_cast<size_t>(r) * ldo + n;
      _mm512_mask_storeu_ps(o, keep, _mm512_sub_ps(_mm512_maskz_loadu_ps(keep, o), accm));
    }
  }
}

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

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE

#endif
