// AVX2 (256-bit, no VNNI) multi-row kernels for Q4_K, Q5_K, Q6_K and IQ4_NL: the prefill path of
// machines without AVX-512 (Zen 1-3, Haswell-Skylake client). Included by qgemm_impl.h after
// kquant_impl.h (it uses dot8_q45k's and dot8_q6k's row types and helpers); only the AVX2
// translation unit compiles it.
//
// Why a second set of kernels beside dot8_q45k / dot8_q6k: those unpack every weight slice for
// each tile of 4 activation rows (Q5_K: the fifth bit merged from the qh slice, Q6_K: the two
// high bits, 6-10 instructions per 32 bytes) and, with all that live at once, GCC spilled about
// two vector registers per vpmaddubsw to the stack (dot8_q45k<4, 1>: ~500 stack references per
// super-block against 256 vpmaddubsw). Here each group of 8 weight rows is expanded once per
// row chunk (up to 128 activation rows) into a scratch of one byte per weight in the exact
// vector order the inner loop reads, with the per-column scales already widened to the int16
// pairs vpmaddwd takes. The inner loop is then one load per weight vector, one broadcast per
// activation dword, and per (row, group) one vpmaddubsw and one int16 add per 32 products.
//
// Exactness: every integer sum is exact (bounds below) and the float operations per (row,
// column) are those of dot8_q45k / dot8_q6k in the same order, so the results are bit-identical
// to theirs, and a single row (decode, which keeps dot8_q45k / dot8_q6k) and a row in any tile
// of a prefill give the same bits.
#pragma once

#if defined(LLMD_ISA_X86) && !defined(LLMD_ISA_VNNI)

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

// Q4_K / Q5_K scratch for one group of 8 columns and one super-block (bytes):
//   [0, 2048)     sub-block j = 0..7, step h = 0..7: 32 bytes at 256j + 32h; column c's q (Q5_K:
//                 the fifth bit merged) of elements 4h .. 4h+3 of sub-block j at 4c
//   [2048, 2304)  sub-block j: 32 bytes at 2048 + 32j, column c's sc[j] in int16 lanes 2c, 2c+1
//   [2304, 2336)  d as fp32 per column        [2336, 2368) dmin as fp32 per column
//   [2368, 2496)  u = 0..3: 32 bytes at 2368 + 32u, int16 pair (m[2u][c], m[2u+1][c]) in lane c
constexpr int kKq45XBytes = 2560;
// Q6_K scratch for one group and one super-block (bytes):
//   [0, 2048)     block j, step i: 32 bytes at 256j + 32i; column c's w = q - 32 in [-32, 31] (int8)
//                 of elements 4i .. 4i+3 of activation block j at 4c
//   [2048, 2560)  block j, half hf: 32 bytes at 2048 + 64j + 32hf, column c's scales[2j + hf]
//                 in int16 lanes 2c, 2c+1
//   [2560, 2816)  block j: 32 bytes at 2560 + 32j, int32 lane c: -128 * (scales[2j] * sum(w of
//                 the first 16) + scales[2j + 1] * sum(w of the second 16))
//   [2816, 2848)  d as fp32 per column
constexpr int kQ6XBytes = 2880;
static_assert(kKq45XBytes % 64 == 0 && kQ6XBytes % 64 == 0);

inline void store32(uint8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline __m256i load32(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }

// One kDword tile super-block (pack8.h) of Q4_K / Q5_K into its scratch.
template <bool kFive>
inline void kq45_expand(const uint8_t* t, uint8_t* s) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  for (int p = 0; p < 4; ++p) {
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 128 + 256 * p + 32 * h));
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kFive) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 1152 + 32 * h));
        lo = _mm256_or_si256(lo, q5_hbit(qh, 2 * p));
        hi = _mm256_or_si256(hi, q5_hbit(qh, 2 * p + 1));
      }
      store32(s + 256 * (2 * p) + 32 * h, lo);
      store32(s + 256 * (2 * p + 1) + 32 * h, hi);
    }
  }
  const __m256i lo0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32));
  const __m256i lo1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64));
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 96));
  const __m256i sc[2] = {_mm256_or_si256(_mm256_and_si256(lo0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
                         _mm256_or_si256(_mm256_and_si256(lo1, m4), _mm256_and_si256(hb, m30))};
#pragma GCC unroll 8
  for (int j = 0; j < kSubBlocks; ++j) store32(s + 2048 + 32 * j, bytes8_dup16(sc[j >> 2], j & 3));
  _mm256_store_ps(reinterpret_cast<float*>(s + 2304),
                  _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t))));
  _mm256_store_ps(reinterpret_cast<float*>(s + 2336),
                  _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16))));
  const __m256i mn[2] = {_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30))};
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) store32(s + 2368 + 32 * u, bytes8_pair16(mn[u >> 1], 2 * (u & 1)));
}

// The rest of a Q6_K scratch once its centred quants are in place: per block j the scales, from
// `pairs` (16 bytes per block, byte 2c + hf: column c's scales[2j + hf], as the kDword tile holds
// them), the weight-only term of the +128 bias, and the 8 columns' fp16 d at `d16`.
inline void q6x_scales(const uint8_t* pairs, const uint8_t* d16, uint8_t* s) {
  const __m256i ones8 = _mm256_set1_epi8(1);
#pragma GCC unroll 8
  for (int j = 0; j < kSubBlocks; ++j) {
    const __m256i scp = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs + 16 * j)));
    const __m256i sc[2] = {_mm256_shufflehi_epi16(_mm256_shufflelo_epi16(scp, 0xa0), 0xa0),
                           _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(scp, 0xf5), 0xf5)};
    __m256i corr = _mm256_setzero_si256();
    for (int hf = 0; hf < 2; ++hf) {
      store32(s + 2048 + 64 * j + 32 * hf, sc[hf]);
      // int16 lanes 2c, 2c+1: column c's sum of w over the half (16 values of at most 32).
      __m256i ws = _mm256_setzero_si256();
      for (int i = 4 * hf; i < 4 * hf + 4; ++i) {
        ws = _mm256_add_epi16(ws, _mm256_maddubs_epi16(ones8, load32(s + 256 * j + 32 * i)));
      }
      corr = _mm256_add_epi32(corr, _mm256_madd_epi16(ws, sc[hf]));
    }
    store32(s + 2560 + 32 * j, _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 7)));
  }
  _mm256_store_ps(reinterpret_cast<float*>(s + 2816),
                  _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16))));
}

// One kDword tile super-block of Q6_K into its scratch: the quants centred (w = q - 32), and per
// block the weight-only term that the activations' +128 bias adds (see dot8_q6k_x).
inline void q6_expand(const uint8_t* t, uint8_t* s) {
  const __m256i m32 = _mm256_set1_epi8(32);
  for (int hp = 0; hp < 4; ++hp) {
    const int h = hp >> 1, p = hp & 1;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      __m256i wa, wb;  // blocks 4h + p (low nibbles) and 4h + p + 2 (high nibbles)
      q6_slice(t + 144 + 512 * h + 256 * p + 32 * i, t + 1168 + 256 * h + 32 * i, p, wa, wb);
      store32(s + 256 * (4 * h + p) + 32 * i, _mm256_sub_epi8(wa, m32));
      store32(s + 256 * (4 * h + p + 2) + 32 * i, _mm256_sub_epi8(wb, m32));
    }
  }
  q6x_scales(t + 16, t, s);
}

// Q4_K / Q5_K over the scratch: R activation rows x G groups (`gbytes` apart). Per sub-block,
// lane c: sum over 8 steps of q[c][e] * a[e] in int16 (Q4_K: 16 products of at most 15 * 127,
// 30480; Q5_K: widened after 4 steps, 8 products of at most 31 * 127, 31496), widened and
// scaled by one vpmaddwd against sc[j]; then dot8_q45k's mins and float step per super-block.
template <int R, int G, bool kFive>
inline void dot8_q45k_x(const uint8_t* s, size_t gbytes, const KqSumRow* a, int nsb, float* const* out) {
  __m256 acc[R][G];
  zero_tiles(acc);
  for (int sb = 0; sb < nsb; ++sb) {
    const uint8_t* ss = s + static_cast<size_t>(sb) * kKq45XBytes;
    __m256i isc[R][G];
    for (int j = 0; j < kSubBlocks; ++j) {
      const int8_t* q[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) q[r] = a[r].b[sb * kSubBlocks + j].q;
      const uint8_t* sj = ss + 256 * j;
      __m256i s16[R][G];
#pragma GCC unroll 8
      for (int h = 0; h < 8; ++h) {
        __m256i wv[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) wv[g] = load32(sj + g * gbytes + 32 * h);
        const bool first = h == 0 || (kFive && h == 4);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i av = broadcast4(q[r] + 4 * h);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) {
            const __m256i p = _mm256_maddubs_epi16(wv[g], av);
            s16[r][g] = first ? p : add16_chain(s16[r][g], p);
          }
        }
        if (h == 7 || (kFive && h == 3)) {
          const bool init = j == 0 && (!kFive || h == 3);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) {
            const __m256i scd = load32(ss + g * gbytes + 2048 + 32 * j);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
              const __m256i v = _mm256_madd_epi16(s16[r][g], scd);
              isc[r][g] = init ? v : add32_chain(isc[r][g], v);
            }
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const uint8_t* sg = ss + g * gbytes;
      const __m256 dg = _mm256_load_ps(reinterpret_cast<const float*>(sg + 2304));
      const __m256 dmg = _mm256_load_ps(reinterpret_cast<const float*>(sg + 2336));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int16_t* bs = a[r].bsum + sb * kSubBlocks;
        __m256i imin = _mm256_madd_epi16(load32(sg + 2368), broadcast4(reinterpret_cast<const int8_t*>(bs)));
#pragma GCC unroll 4
        for (int u = 1; u < 4; ++u) {
          const __m256i b = broadcast4(reinterpret_cast<const int8_t*>(bs + 2 * u));
          imin = _mm256_add_epi32(imin, _mm256_madd_epi16(load32(sg + 2368 + 32 * u), b));
        }
        const __m256 x =
            _mm256_fmsub_ps(_mm256_cvtepi32_ps(isc[r][g]), dg, _mm256_mul_ps(_mm256_cvtepi32_ps(imin), dmg));
        acc[r][g] = _mm256_fmadd_ps(x, _mm256_set1_ps(a[r].b[sb * kSubBlocks].d), acc[r][g]);
      }
    }
  }
  store_tiles(acc, out);
}

// The activation rows of dot8_q6k_x: each block with its quants biased to unsigned (a + 128, the
// bits of a ^ 0x80), so that vpmaddubsw's unsigned operand is the activation and its signed one
// the centred weight. Built once per call for all rows (rows x k bytes).
struct Q6XRow {
  const ActBlock* b;
};
struct Q6XRows {
  using Row = Q6XRow;
  const ActBlock* biased;
  int nb;
  Q6XRows(const ActBlock* a, int rows, int nb_) : nb(nb_) {
    thread_local std::vector<ActBlock> buf;
    const size_t n = static_cast<size_t>(rows) * nb;
    grow_scratch(buf, n);
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    for (size_t i = 0; i < n; ++i) {
      buf[i].d = a[i].d;
      buf[i].s = a[i].s;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].q));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf[i].q), _mm256_xor_si256(q, bias));
    }
    biased = buf.data();
  }
  Row row(int r) const { return {biased + static_cast<size_t>(r) * nb}; }
};

// Q6_K over the scratch. Per block, lane c: sum over the two halves of scales[half] * dot(q - 32,
// a), the integer dot8_q6k computes (there as -32 * sum(a) plus dot(q, a)); the 8 blocks' sums
// added in int32 (the activations share one scale per super-block: uses_superblock_activations)
// and one float step per super-block, dot8_q6k's (AVX2): the same bits.
// Why the activations biased: dot8_q6k's -32 * sum(a) term takes a broadcast and a vpmaddwd
// per (row, block). With u = a + 128 in [1, 255] and w = q - 32 in [-32, 31],
// dot(w, a) = dot(u, w) - 128 * sum(w), and the second term depends on the weights alone: the
// expansion stores it per block (scaled) and each block adds it to every row's sum. Bounds:
// |u * w| <= 255 * 32 = 8160, so a vpmaddubsw pair is at most 16320 and two steps (4 products
// per int16 lane) 32640: pairs of steps sum in int16, each pair widened and scaled by
// vpmaddwd. int32: a block's biased dot is at most 2 * 128 * 16 * 8160 < 2^26 and its weight
// term 2 * 128 * 128 * 512 = 2^24, so a super-block's running sum stays below 2^30.
// Why one float step per super-block: the float conversion, multiply and FMA per block and row
// go to the vector ports the vpmaddubsw / vpmaddwd need. Per 32 vpmaddubsw of a 4-row tile this
// kernel issued 20 vpmaddwd and 12 float operations (Q4_K's: ~4 and almost none), now 16 and
// 1.5; 512 x 2048 x 2048 on a Zen 5 core (AVX2 code), 122 -> 143 GMAC/s (bench/README.md).
template <int R, int G>
inline void dot8_q6k_x(const uint8_t* s, size_t gbytes, const Q6XRow* a, int nsb, float* const* out) {
  __m256 acc[R][G];
  zero_tiles(acc);
  for (int sb = 0; sb < nsb; ++sb) {
    const uint8_t* ss = s + static_cast<size_t>(sb) * kQ6XBytes;
    const ActBlock* ab[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) ab[r] = a[r].b + sb * kSubBlocks;
    __m256i isum[R][G];
#pragma GCC unroll 8
    for (int j = 0; j < kSubBlocks; ++j) {
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m256i corr = load32(ss + g * gbytes + 2560 + 32 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) isum[r][g] = j == 0 ? corr : add32_chain(isum[r][g], corr);
      }
      const uint8_t* sj = ss + 256 * j;
#pragma GCC unroll 4
      for (int i = 0; i < 8; i += 2) {
        __m256i w0[G], w1[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          w0[g] = load32(sj + g * gbytes + 32 * i);
          w1[g] = load32(sj + g * gbytes + 32 * i + 32);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* q = ab[r][j].q;
          const __m256i a0 = broadcast4(q + 4 * i);
          const __m256i a1 = broadcast4(q + 4 * i + 4);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) {
            const __m256i s16 = add16_chain(_mm256_maddubs_epi16(a0, w0[g]), _mm256_maddubs_epi16(a1, w1[g]));
            const __m256i sc = load32(ss + g * gbytes + 2048 + 64 * j + 32 * (i >> 2));
            isum[r][g] = add32_chain(isum[r][g], _mm256_madd_epi16(s16, sc));
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m256 dg = _mm256_load_ps(reinterpret_cast<const float*>(ss + g * gbytes + 2816));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float ad = ab[r][0].d;
        acc[r][g] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][g]), _mm256_mul_ps(dg, _mm256_set1_ps(ad)), acc[r][g]);
      }
    }
  }
  store_tiles(acc, out);
}

// A packed type's expansion: Expand writes the scratch of one tile block (tile_bytes apart).
template <void (*Expand)(const uint8_t*, uint8_t*)>
struct PackedExpand {
  static void expand(const uint8_t* group, size_t /*rb*/, int tile_bytes, int block, uint8_t* s) {
    Expand(group + static_cast<size_t>(block) * tile_bytes, s);
  }
};

// Rows > 1: each group of kG x 8 columns is expanded once per row chunk (packed_row_chunk), then
// swept by tiles of kR rows (the rows left over form one smaller tile). `Expander::expand`
// writes the scratch of one block of kElems elements (a super-block; IQ4_NL: a block of 32) of
// the group's 8 rows (a packed tile, PackedExpand, or 8 GGUF rows rb bytes apart:
// kquant_low_bits_prefill.h); `Kernel<R, G>::run` is one tile. The loops only order the work:
// no output's operations depend on them.
template <int kR, int kG, int kXBytes, class Rows, class Expander, template <int, int> class Kernel,
          int kElems = kSuper>
inline void gemm_kq_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                             float* out, int ldo, int tile_bytes) {
  using Row = typename Rows::Row;
  const int nb = k / kBlock;
  const int nsb = k / kElems;
  const Rows act(a, rows, nb);
  const size_t gbytes = static_cast<size_t>(nsb) * kXBytes;
  struct alignas(64) Line {
    uint8_t b[64];
  };
  thread_local std::vector<Line> scratch;  // cache-line aligned (the kernels' loads are aligned)
  const size_t lines = (kG * gbytes + sizeof(Line) - 1) / sizeof(Line);
  uint8_t* s = reinterpret_cast<uint8_t*>(grow_scratch(scratch, lines));
  const int chunk = packed_row_chunk(k);
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int r1 = std::min(rows, r0 + chunk);
    for (int n = n0; n < n1;) {
      const int groups = std::min(kG, (n1 - n) / 8);
      for (int g = 0; g < groups; ++g) {
        const uint8_t* group = w + static_cast<size_t>(n + 8 * g) * rb;
        for (int sb = 0; sb < nsb; ++sb) {
          Expander::expand(group, rb, tile_bytes, sb, s + g * gbytes + static_cast<size_t>(sb) * kXBytes);
        }
      }
      // The next groups' packed bytes, a slice per tile, into L2 while these tiles run: the
      // expansion reads a group (8 rows: 54 KB of Q6_K at k = 8192) once per row chunk, and
      // left to the hardware prefetcher it waited on memory for most lines (27% of a
      // 256 x 1024 x 8192 Q6_K product's samples, where the chunk is 32 rows: 8 tiles per group).
      const int n_next = n + 8 * groups;
      const size_t pf_lines =
          n_next < n1 ? static_cast<size_t>(std::min(kG, (n1 - n_next) / 8)) * 8 * rb / 64 : 0;
      const uint8_t* pf = w + static_cast<size_t>(n_next) * rb;
      const int tiles = (r1 - r0 + kR - 1) / kR;
      for (int r = r0; r < r1; r += kR) {
        const int t = (r - r0) / kR;
        for (size_t l = pf_lines * t / tiles; l < pf_lines * (t + 1) / tiles; ++l) {
          _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * l), _MM_HINT_T1);
        }
        const int t_rows = std::min(kR, r1 - r);
        Row rows_a[kR];
        float* outs[kR];
        for (int t = 0; t < t_rows; ++t) {
          rows_a[t] = act.row(r + t);
          outs[t] = out + static_cast<size_t>(r + t) * ldo + n;
        }
        Kernel<kR, kG>::dispatch(t_rows, groups, s, gbytes, rows_a, nsb, outs);
      }
      n += 8 * groups;
    }
  }
}

// Runs a tile of `rows` (1 .. R) rows and `groups` (1 .. G) groups as compile-time shapes.
template <int R, int G, class Row, class Fn>
inline void dispatch_tile(int rows, int groups, Fn&& fn) {
  if constexpr (R > 1) {
    if (rows < R) return dispatch_tile<R - 1, G, Row>(rows, groups, fn);
  }
  if constexpr (G > 1) {
    if (groups < G) return dispatch_tile<R, G - 1, Row>(rows, groups, fn);
  }
  fn.template operator()<R, G>();
}

template <bool kFive>
struct Kq45X {
  template <int R, int G>
  struct Tile {
    static void dispatch(int rows, int groups, const uint8_t* s, size_t gbytes, const KqSumRow* a, int nsb,
                         float* const* out) {
      dispatch_tile<R, G, KqSumRow>(rows, groups,
                                    [&]<int R2, int G2>() { dot8_q45k_x<R2, G2, kFive>(s, gbytes, a, nsb, out); });
    }
  };
};

template <int R, int G>
struct Q6X {
  static void dispatch(int rows, int groups, const uint8_t* s, size_t gbytes, const Q6XRow* a, int nsb,
                       float* const* out) {
    dispatch_tile<R, G, Q6XRow>(rows, groups, [&]<int R2, int G2>() { dot8_q6k_x<R2, G2>(s, gbytes, a, nsb, out); });
  }
};

// Tiles of 4 rows x 1 group: on one Zen 5 core (AVX2 code), 96 x 1024 x 2048, GMAC/s for
// 4x1 / 6x1 / 8x1 / 3x2 / 4x2 rows x groups: Q4_K 154 / 151 / 150 / 155 / 149, Q5_K 154 / 142 / 140
// / 137 / 137, Q6_K 119 / 117 / 116 / 121 / 116 (two groups spill: 16 vector registers). A
// single row (decode) keeps gemm_packed's kernels, which stream the packed tile once.
constexpr int kExpandedRows = 4;

// A few rows (a batched decode step) also keep gemm_packed's kernels: the expansion of a
// super-block is paid once per row chunk, and with a handful of rows it is not won back. One
// Zen 1 core (AVX2 only), 2048 x 2048, GMAC/s for 2 / 4 / 8 / 16 / 32 rows, expanded vs packed:
// Q4_K 15.2 / 19.3 / 22.0 / 23.7 / 24.8 vs 28.1 / 22.8-28.2 / 24.2 / 24.4 / 24.4; Q5_K 12.2 /
// 16.3 / 19.8 / 22.1 / 23.5 vs 17.0 / 18.7 / 19.0 / 19.3 / 19.3; Q6_K 10.7 / 14.6 / 17.4 / 20.5 /
// 22.1 vs 15.5 / 17.4-19.8 / 17.9 / 18.0 / 18.0. Both give the same bits (the same per-lane
// operations), so the choice only moves time.
constexpr int kPackedRowsQ4K = 8;
constexpr int kPackedRowsQ56K = 4;

inline void gemm_q4_k_x8_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                  float* out, int ldo) {
  if (rows <= kPackedRowsQ4K) return gemm_q4_k_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kq_expanded<kExpandedRows, 1, kKq45XBytes, KqSumRows, PackedExpand<kq45_expand<false>>, Kq45X<false>::Tile>(
      w, rb, a, k, rows, n0, n1, out, ldo, 8 * kQ4KBytes);
}
inline void gemm_q5_k_x8_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                  float* out, int ldo) {
  if (rows <= kPackedRowsQ56K) return gemm_q5_k_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kq_expanded<kExpandedRows, 1, kKq45XBytes, KqSumRows, PackedExpand<kq45_expand<true>>, Kq45X<true>::Tile>(
      w, rb, a, k, rows, n0, n1, out, ldo, 8 * kQ5KBytes);
}
inline void gemm_q6_k_x8_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                  float* out, int ldo) {
  if (rows <= kPackedRowsQ56K) return gemm_q6_k_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kq_expanded<kExpandedRows, 1, kQ6XBytes, Q6XRows, PackedExpand<q6_expand>, Q6X>(w, rb, a, k, rows, n0, n1,
                                                                                     out, ldo, 8 * kQ6KBytes);
}

// IQ4_NL: a row chunk's group is expanded into the Q8_0 tile (pack8.h) of the same weights, its
// levels as signed bytes, and Q8_0's kernel runs the tiles. Why: dot8_q4's IQ4_NL tile looks the
// nibbles up and takes their magnitudes for every tile of 4 rows (7 instructions per 32 bytes
// beside the 8 of the products), and on AVX2 a level times an activation needs Q8_0's sign
// trick and widening anyway, so once expanded the inner loop is Q8_0's. The integer sum of a
// block is exact either way and the float step per block is dot8_q4's, so the bits are those
// of the single-row kernel. One Zen 1 core (bench/kquant_kernel_bench.cpp), 2048 x 2048, GMAC/s
// for 5 / 8 / 32 / 128 rows: expanded 16.9 / 18.3 / 19.8 / 19.3 against dot8_q4's 17.5 / 18.2 /
// 17.9 / 17.3 (Q8_0's kernel on Q8_0 weights: 128 rows 19.9), so up to 8 rows (a batched decode
// step) keep dot8_q4.
// Expands one packed IQ4_NL tile t (a block of 8 rows) into the Q8_0 tile of the same weights at s
// (kQ8TileBytes): d[8] fp16, then chunk j = 0..7: row c's levels 4j .. 4j+3 at 4c.
inline void iq4nl_expand(const uint8_t* t, uint8_t* s) {
  const __m256i levels = iq4nl_levels(false);
  const __m256i mask = _mm256_set1_epi8(0x0f);
  std::memcpy(s, t, 16);
  for (int h = 0; h < 4; ++h) {
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 16 + 32 * h));
    const __m256i lo = _mm256_shuffle_epi8(levels, _mm256_and_si256(p, mask));  // elements 4h ..
    const __m256i hi = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(p, 4), mask));  // 16 + 4h ..
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + 16 + 32 * h), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + 16 + 32 * (4 + h)), hi);
  }
}

template <int R, int G>
struct Iq4nlX {
  static void dispatch(int rows, int groups, const uint8_t* s, size_t gbytes, const ActBlock* const* a, int nb,
                       float* const* out) {
    dispatch_tile<R, G, const ActBlock*>(rows, groups,
                                         [&]<int R2, int G2>() { dot8_q8<R2, G2>(s, gbytes, a, nb, out, false); });
  }
};

constexpr int kPackedRowsIq4nl = 8;

inline void gemm_iq4_nl_x8_expanded(const uint8_t* w, size_t rb, const ActBlock* a, int k, int rows, int n0, int n1,
                                    float* out, int ldo) {
  if (rows <= kPackedRowsIq4nl) return gemm_iq4_nl_x8(w, rb, a, k, rows, n0, n1, out, ldo);
  gemm_kq_expanded<kExpandedRows, 1, kQ8TileBytes, PlainRows, PackedExpand<iq4nl_expand>, Iq4nlX, kBlock>(
      w, rb, a, k, rows, n0, n1, out, ldo, 8 * kIq4nlBlockBytes);
}

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE

#endif
