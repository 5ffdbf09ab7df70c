#include "pack8.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "../../core/legacy_q5.h"

namespace llmd::kernels {

namespace {

// How one row's GGUF block maps into a tile block of 8 rows (pack8.h): `to_tile` writes row
// c's block into the tile, `from_tile` reads it back; each touches only row c's bytes, so a
// row can be unpacked alone and packing is a byte-exact bijection.
struct Codec {
  int elements;  // elements per GGUF block (32, or 256 for K-quants)
  int bytes;     // bytes of one GGUF block
  void (*to_tile)(const uint8_t* block, int c, uint8_t* tile);
  void (*from_tile)(const uint8_t* tile, int c, uint8_t* block);
};

// Q4_0 / Q4_1 / Q8_0: scale fields (fp16 d, Q4_1's fp16 m) then the quants in 4-byte slices.
template <int kScaleBytes, int kSlices>
void copy_pieces(const uint8_t* src, uint8_t* dst, int c, bool to_tile) {
  auto piece = [&](int tile_off, int block_off, int n) {
    if (to_tile) {
      std::memcpy(dst + tile_off, src + block_off, n);
    } else {
      std::memcpy(dst + block_off, src + tile_off, n);
    }
  };
  for (int f = 0; f < kScaleBytes / 2; ++f) piece(16 * f + 2 * c, 2 * f, 2);
  for (int s = 0; s < kSlices; ++s) piece(kScaleBytes * 8 + 32 * s + 4 * c, kScaleBytes + 4 * s, 4);
}

template <int kScaleBytes, int kSlices>
Codec legacy_codec(int bytes) {
  return {32, bytes, [](const uint8_t* block, int c, uint8_t* tile) { copy_pieces<kScaleBytes, kSlices>(block, tile, c, true); },
          [](const uint8_t* tile, int c, uint8_t* block) { copy_pieces<kScaleBytes, kSlices>(tile, block, c, false); }};
}

// Q4_0 / Q4_1 / Q8_0 kQword tile (pack8.h): two GGUF blocks (x = block 2p, y = 2p + 1) of row c.
// Element i of a 4-bit block is the low nibble of qs[i] (i < 16) or the high nibble of qs[i - 16].
int q4_element(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }

// kFields fp16 scale fields (Q4_0 / IQ4_NL: d; Q4_1: d, m), field f of block e at 32f + 2(2c + e),
// then the codes from byte 32 * kFields.
template <int kFields>
void q4_pair_to_tile(const uint8_t* blocks, int c, uint8_t* tile) {
  constexpr int kBytes = 2 * kFields + 16;
  for (int e = 0; e < 2; ++e) {
    const uint8_t* b = blocks + kBytes * e;
    for (int f = 0; f < kFields; ++f) std::memcpy(tile + 32 * f + 2 * (2 * c + e), b + 2 * f, 2);
    for (int s = 0; s < 4; ++s) {
      for (int j = 0; j < 4; ++j) {
        tile[32 * kFields + 64 * s + 8 * c + 4 * e + j] = static_cast<uint8_t>(
            q4_element(b + 2 * kFields, 8 * s + j) | (q4_element(b + 2 * kFields, 8 * s + 4 + j) << 4));
      }
    }
  }
}

template <int kFields>
void q4_pair_from_tile(const uint8_t* tile, int c, uint8_t* blocks) {
  constexpr int kBytes = 2 * kFields + 16;
  for (int e = 0; e < 2; ++e) {
    uint8_t* b = blocks + kBytes * e;
    for (int f = 0; f < kFields; ++f) std::memcpy(b + 2 * f, tile + 32 * f + 2 * (2 * c + e), 2);
    uint8_t q[32];
    for (int s = 0; s < 4; ++s) {
      for (int j = 0; j < 4; ++j) {
        const uint8_t v = tile[32 * kFields + 64 * s + 8 * c + 4 * e + j];
        q[8 * s + j] = v & 15;
        q[8 * s + 4 + j] = v >> 4;
      }
    }
    for (int i = 0; i < 16; ++i) b[2 * kFields + i] = static_cast<uint8_t>(q[i] | (q[i + 16] << 4));
  }
}

// Q8_0's quants are stored as q + 128 (q ^ 0x80), the unsigned operand of vpdpbusd.
void q8_0_pair_to_tile(const uint8_t* blocks, int c, uint8_t* tile) {
  for (int e = 0; e < 2; ++e) {
    const uint8_t* b = blocks + 34 * e;
    std::memcpy(tile + 2 * (2 * c + e), b, 2);
    for (int s = 0; s < 8; ++s) {
      for (int j = 0; j < 4; ++j) tile[32 + 64 * s + 8 * c + 4 * e + j] = b[2 + 4 * s + j] ^ 0x80;
    }
  }
}

void q8_0_pair_from_tile(const uint8_t* tile, int c, uint8_t* blocks) {
  for (int e = 0; e < 2; ++e) {
    uint8_t* b = blocks + 34 * e;
    std::memcpy(b, tile + 2 * (2 * c + e), 2);
    for (int s = 0; s < 8; ++s) {
      for (int j = 0; j < 4; ++j) b[2 + 4 * s + j] = tile[32 + 64 * s + 8 * c + 4 * e + j] ^ 0x80;
    }
  }
}

// Q5_0 / Q5_1 (core/legacy_q5.h): Q4_0's / Q4_1's tile of the codes' low 4 bits (the scale
// fields, then chunk h's 4 bytes of row c at S + 32h + 4c; S = 16 or 32 bytes of scale fields),
// then their fifth bits as 8 bit planes: byte S + 128 + 4c + j, bit 2h the fifth bit of row c's
// element 4h + j, bit 2h + 1 that of element 16 + 4h + j (one load serves a block's 4 chunks).
template <bool kHasMin>
void q5_to_tile(const uint8_t* block, int c, uint8_t* tile) {
  constexpr int kS = kHasMin ? 32 : 16;
  std::memcpy(tile + 2 * c, block, 2);
  if constexpr (kHasMin) std::memcpy(tile + 16 + 2 * c, block + 2, 2);
  const uint8_t* qs = block + q5_qs_offset(kHasMin);
  const uint32_t qh = q5_fifth_bits(block, kHasMin);
  for (int h = 0; h < 4; ++h) std::memcpy(tile + kS + 32 * h + 4 * c, qs + 4 * h, 4);
  for (int j = 0; j < 4; ++j) {
    uint8_t planes = 0;
    for (int h = 0; h < 4; ++h) {
      planes = static_cast<uint8_t>(planes | (((qh >> (4 * h + j)) & 1) << (2 * h)) |
                                    (((qh >> (16 + 4 * h + j)) & 1) << (2 * h + 1)));
    }
    tile[kS + 128 + 4 * c + j] = planes;
  }
}

template <bool kHasMin>
void q5_from_tile(const uint8_t* tile, int c, uint8_t* block) {
  constexpr int kS = kHasMin ? 32 : 16;
  std::memcpy(block, tile + 2 * c, 2);
  if constexpr (kHasMin) std::memcpy(block + 2, tile + 16 + 2 * c, 2);
  uint8_t* qs = block + q5_qs_offset(kHasMin);
  for (int h = 0; h < 4; ++h) std::memcpy(qs + 4 * h, tile + kS + 32 * h + 4 * c, 4);
  uint32_t qh = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t planes = tile[kS + 128 + 4 * c + j];
    for (int h = 0; h < 4; ++h) {
      qh |= ((planes >> (2 * h)) & 1) << (4 * h + j);
      qh |= ((planes >> (2 * h + 1)) & 1) << (16 + 4 * h + j);
    }
  }
  std::memcpy(block + q5_qh_offset(kHasMin), &qh, 4);
}

// Q5_0 / Q5_1 kQword tile: Q4_0's / Q4_1's pair tile of the codes' low 4 bits, then per slice s
// two 64-bit masks at 32 kFields + 256 + 16s (low, high nibbles): bit 8c + 4e + j the fifth bit
// of element 8s + j (8s + 4 + j) of block 2p + e; row c owns byte c of each.
template <bool kHasMin>
void q5_pair_to_tile(const uint8_t* blocks, int c, uint8_t* tile) {
  constexpr int kFields = kHasMin ? 2 : 1;
  constexpr int kBytes = q5_block_bytes(kHasMin);
  uint8_t q[2][32];
  for (int e = 0; e < 2; ++e) {
    const uint8_t* b = blocks + kBytes * e;
    q5_block_codes(b, kHasMin, q[e]);
    for (int f = 0; f < kFields; ++f) std::memcpy(tile + 32 * f + 2 * (2 * c + e), b + 2 * f, 2);
  }
  for (int s = 0; s < 4; ++s) {
    uint8_t lo = 0, hi = 0;
    for (int e = 0; e < 2; ++e) {
      for (int j = 0; j < 4; ++j) {
        const int a = 8 * s + j, b = 8 * s + 4 + j;
        tile[32 * kFields + 64 * s + 8 * c + 4 * e + j] = static_cast<uint8_t>((q[e][a] & 15) | ((q[e][b] & 15) << 4));
        lo = static_cast<uint8_t>(lo | ((q[e][a] >> 4) << (4 * e + j)));
        hi = static_cast<uint8_t>(hi | ((q[e][b] >> 4) << (4 * e + j)));
      }
    }
    tile[32 * kFields + 256 + 16 * s + c] = lo;
    tile[32 * kFields + 256 + 16 * s + 8 + c] = hi;
  }
}

template <bool kHasMin>
void q5_pair_from_tile(const uint8_t* tile, int c, uint8_t* blocks) {
  constexpr int kFields = kHasMin ? 2 : 1;
  constexpr int kBytes = q5_block_bytes(kHasMin);
  for (int e = 0; e < 2; ++e) {
    uint8_t* b = blocks + kBytes * e;
    for (int f = 0; f < kFields; ++f) std::memcpy(b + 2 * f, tile + 32 * f + 2 * (2 * c + e), 2);
    uint8_t q[32];
    for (int s = 0; s < 4; ++s) {
      const uint8_t lo = tile[32 * kFields + 256 + 16 * s + c];
      const uint8_t hi = tile[32 * kFields + 256 + 16 * s + 8 + c];
      for (int j = 0; j < 4; ++j) {
        const uint8_t v = tile[32 * kFields + 64 * s + 8 * c + 4 * e + j];
        q[8 * s + j] = static_cast<uint8_t>((v & 15) | (((lo >> (4 * e + j)) & 1) << 4));
        q[8 * s + 4 + j] = static_cast<uint8_t>((v >> 4) | (((hi >> (4 * e + j)) & 1) << 4));
      }
    }
    uint32_t qh = 0;
    uint8_t* qs = b + q5_qs_offset(kHasMin);
    for (int i = 0; i < 16; ++i) {
      qs[i] = static_cast<uint8_t>((q[i] & 15) | ((q[i + 16] & 15) << 4));
      qh |= static_cast<uint32_t>(q[i] >> 4) << i;
      qh |= static_cast<uint32_t>(q[i + 16] >> 4) << (i + 16);
    }
    std::memcpy(b + q5_qh_offset(kHasMin), &qh, 4);
  }
}

// Q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4
// packing), 128 bytes of nibbles. Q5_K has the same fields with qh[32] before the nibbles
// (kQs = 48 instead of 16) and its tile appends the qh slices (kQword: the fifth-bit masks).
template <int kQs, bool kQword>
void q45k_to_tile(const uint8_t* block, int c, uint8_t* tile) {
  std::memcpy(tile + 2 * c, block, 2);
  std::memcpy(tile + 16 + 2 * c, block + 2, 2);
  const uint8_t* s = block + 4;
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
  for (int j = 0; j < 8; ++j) tile[32 + 8 * j + c] = static_cast<uint8_t>((sc[j] & 15) | ((mn[j] & 15) << 4));
  for (int j = 0; j < 4; ++j) {
    tile[96 + 8 * j + c] = static_cast<uint8_t>((sc[j] >> 4) | ((mn[j] >> 4) << 2) | ((sc[j + 4] >> 4) << 4) |
                                                ((mn[j + 4] >> 4) << 6));
  }
  if constexpr (kQword) {
    const uint8_t* qs = block + kQs;
    for (int p = 0; p < 4; ++p) {
      for (int s = 0; s < 4; ++s) {
        uint8_t* dst = tile + 128 + 256 * p + 64 * s + 8 * c;
        uint8_t mask[2] = {0, 0};  // fifth bits of the low / high nibbles of dst[0..7]
        for (int j = 0; j < 4; ++j) {
          for (int e = 0; e < 2; ++e) {  // e: sub-block 2p + e, in bytes 4e .. 4e + 3
            const int lo = 8 * s + j, hi = 8 * s + 4 + j;
            dst[4 * e + j] = static_cast<uint8_t>(((qs[32 * p + lo] >> (4 * e)) & 15) |
                                                  (((qs[32 * p + hi] >> (4 * e)) & 15) << 4));
            if constexpr (kQs == 48) {
              mask[0] |= static_cast<uint8_t>(((block[16 + lo] >> (2 * p + e)) & 1) << (4 * e + j));
              mask[1] |= static_cast<uint8_t>(((block[16 + hi] >> (2 * p + e)) & 1) << (4 * e + j));
            }
          }
        }
        if constexpr (kQs == 48) {
          tile[1152 + 64 * p + 16 * s + c] = mask[0];
          tile[1152 + 64 * p + 16 * s + 8 + c] = mask[1];
        }
      }
    }
    return;
  }
  for (int p = 0; p < 4; ++p) {
    for (int h = 0; h < 8; ++h) std::memcpy(tile + 128 + 256 * p + 32 * h + 4 * c, block + kQs + 32 * p + 4 * h, 4);
  }
  if constexpr (kQs == 48) {
    for (int h = 0; h < 8; ++h) std::memcpy(tile + 1152 + 32 * h + 4 * c, block + 16 + 4 * h, 4);
  }
}

template <int kQs, bool kQword>
void q45k_from_tile(const uint8_t* tile, int c, uint8_t* block) {
  std::memcpy(block, tile + 2 * c, 2);
  std::memcpy(block + 2, tile + 16 + 2 * c, 2);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    const uint8_t lo = tile[32 + 8 * j + c];
    const uint8_t hi = tile[96 + 8 * (j % 4) + c] >> (j < 4 ? 0 : 4);
    sc[j] = static_cast<uint8_t>((lo & 15) | ((hi & 3) << 4));
    mn[j] = static_cast<uint8_t>((lo >> 4) | (((hi >> 2) & 3) << 4));
  }
  uint8_t* s = block + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  if constexpr (kQword) {
    uint8_t* qs = block + kQs;
    if constexpr (kQs == 48) std::memset(block + 16, 0, 32);
    for (int p = 0; p < 4; ++p) {
      for (int s = 0; s < 4; ++s) {
        const uint8_t* src = tile + 128 + 256 * p + 64 * s + 8 * c;
        for (int j = 0; j < 4; ++j) {
          const int lo = 8 * s + j, hi = 8 * s + 4 + j;
          qs[32 * p + lo] = static_cast<uint8_t>((src[j] & 15) | ((src[4 + j] & 15) << 4));
          qs[32 * p + hi] = static_cast<uint8_t>((src[j] >> 4) | ((src[4 + j] >> 4) << 4));
          if constexpr (kQs == 48) {
            for (int e = 0; e < 2; ++e) {
              const int bit = 4 * e + j;
              block[16 + lo] |= static_cast<uint8_t>(((tile[1152 + 64 * p + 16 * s + c] >> bit) & 1) << (2 * p + e));
              block[16 + hi] |= static_cast<uint8_t>(((tile[1152 + 64 * p + 16 * s + 8 + c] >> bit) & 1) << (2 * p + e));
            }
          }
        }
      }
    }
    return;
  }
  for (int p = 0; p < 4; ++p) {
    for (int h = 0; h < 8; ++h) std::memcpy(block + kQs + 32 * p + 4 * h, tile + 128 + 256 * p + 32 * h + 4 * c, 4);
  }
  if constexpr (kQs == 48) {
    for (int h = 0; h < 8; ++h) std::memcpy(block + 16 + 4 * h, tile + 1152 + 32 * h + 4 * c, 4);
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], fp16 d.
template <class Fn>
void q6k_pieces(int c, Fn piece) {
  piece(2 * c, 208, 2);
  for (int b = 0; b < 8; ++b) piece(16 + 16 * b + 2 * c, 192 + 2 * b, 2);
  for (int h = 0; h < 2; ++h) {
    for (int p = 0; p < 2; ++p) {
      for (int i = 0; i < 8; ++i) piece(144 + 512 * h + 256 * p + 32 * i + 4 * c, 64 * h + 32 * p + 4 * i, 4);
    }
    for (int i = 0; i < 8; ++i) piece(1168 + 256 * h + 32 * i + 4 * c, 128 + 32 * h + 4 * i, 4);
  }
}

void q6k_to_tile(const uint8_t* block, int c, uint8_t* tile) {
  q6k_pieces(c, [&](int t, int o, int n) { std::memcpy(tile + t, block + o, n); });
}
void q6k_from_tile(const uint8_t* tile, int c, uint8_t* block) {
  q6k_pieces(c, [&](int t, int o, int n) { std::memcpy(block + o, tile + t, n); });
}

// Q6_K's kQword tile: element E of a block is bits 0-3 of a ql nibble and bits 4-5 from qh
// (dequantize_row_q6_K's order: E = 128h + 32 quarter + l).
int q6_ql_index(int e) { return 64 * (e / 128) + 32 * ((e % 128 / 32) & 1) + e % 32; }
int q6_ql_shift(int e) { return e % 128 / 64 * 4; }
int q6_qh_index(int e) { return 128 + 32 * (e / 128) + e % 32; }
int q6_qh_shift(int e) { return 2 * (e % 128 / 32); }

// Tile element of row c, pair p, slice s, block 2p + e, byte j and nibble n (0 low, 1 high):
// block element 32 (2p + e) + 8s + 4n + j.
template <class Fn>
void q6k_qword_elements(Fn fn) {
  for (int p = 0; p < 4; ++p) {
    for (int s = 0; s < 4; ++s) {
      for (int e = 0; e < 2; ++e) {
        for (int j = 0; j < 4; ++j) {
          for (int n = 0; n < 2; ++n) {
            const int ql_byte = 144 + 256 * p + 64 * s + 4 * e + j;  // + 8c
            const int qh_byte = 1168 + 128 * p + 64 * (s / 2) + 4 * e + j;
            const int qh_shift = 4 * (s % 2) + 2 * n;
            fn(32 * (2 * p + e) + 8 * s + 4 * n + j, ql_byte, 4 * n, qh_byte, qh_shift);
          }
        }
      }
    }
  }
}

void q6k_qword_to_tile(const uint8_t* block, int c, uint8_t* tile) {
  std::memcpy(tile + 2 * c, block + 208, 2);
  for (int p = 0; p < 4; ++p) {
    for (int hf = 0; hf < 2; ++hf) {
      for (int e = 0; e < 2; ++e) tile[16 + 32 * p + 16 * hf + 2 * c + e] = block[192 + 2 * (2 * p + e) + hf];
    }
  }
  for (int b = 144; b < 1680; b += 64) std::memset(tile + b + 8 * c, 0, 8);
  q6k_qword_elements([&](int el, int ql_byte, int ql_shift, int qh_byte, int qh_shift) {
    const int lo4 = (block[q6_ql_index(el)] >> q6_ql_shift(el)) & 15;
    const int hi2 = (block[q6_qh_index(el)] >> q6_qh_shift(el)) & 3;
    tile[ql_byte + 8 * c] |= static_cast<uint8_t>(lo4 << ql_shift);
    tile[qh_byte + 8 * c] |= static_cast<uint8_t>(hi2 << qh_shift);
  });
}

void q6k_qword_from_tile(const uint8_t* tile, int c, uint8_t* block) {
  std::memcpy(block + 208, tile + 2 * c, 2);
  for (int p = 0; p < 4; ++p) {
    for (int hf = 0; hf < 2; ++hf) {
      for (int e = 0; e < 2; ++e) block[192 + 2 * (2 * p + e) + hf] = tile[16 + 32 * p + 16 * hf + 2 * c + e];
    }
  }
  std::memset(block, 0, 192);
  q6k_qword_elements([&](int el, int ql_byte, int ql_shift, int qh_byte, int qh_shift) {
    const int lo4 = (tile[ql_byte + 8 * c] >> ql_shift) & 15;
    const int hi2 = (tile[qh_byte + 8 * c] >> qh_shift) & 3;
    block[q6_ql_index(el)] |= static_cast<uint8_t>(lo4 << q6_ql_shift(el));
    block[q6_qh_index(el)] |= static_cast<uint8_t>(hi2 << q6_qh_shift(el));
  });
}

Codec codec_of(TensorType type, PackLayout layout, int k) {
  const bool qword = layout == PackLayout::kQword;
  // Q4_0 / Q4_1 / Q8_0 pair blocks in the kQword tile, so it needs an even number of them per row.
  const bool pairs = qword && k % 64 == 0;
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::IQ4_NL:  // Q4_0's block bytes (only what a code stands for differs)
      return pairs ? Codec{64, 36, q4_pair_to_tile<1>, q4_pair_from_tile<1>} : legacy_codec<2, 4>(18);
    case TensorType::Q4_1:
      return pairs ? Codec{64, 40, q4_pair_to_tile<2>, q4_pair_from_tile<2>} : legacy_codec<4, 4>(20);
    case TensorType::Q8_0:
      return pairs ? Codec{64, 68, q8_0_pair_to_tile, q8_0_pair_from_tile} : legacy_codec<2, 8>(34);
    case TensorType::Q5_0:
      return pairs ? Codec{64, 44, q5_pair_to_tile<false>, q5_pair_from_tile<false>}
                   : Codec{32, 22, q5_to_tile<false>, q5_from_tile<false>};
    case TensorType::Q5_1:
      return pairs ? Codec{64, 48, q5_pair_to_tile<true>, q5_pair_from_tile<true>}
                   : Codec{32, 24, q5_to_tile<true>, q5_from_tile<true>};
    case TensorType::Q4_K:
      return qword ? Codec{256, 144, q45k_to_tile<16, true>, q45k_from_tile<16, true>}
                   : Codec{256, 144, q45k_to_tile<16, false>, q45k_from_tile<16, false>};
    case TensorType::Q5_K:
      return qword ? Codec{256, 176, q45k_to_tile<48, true>, q45k_from_tile<48, true>}
                   : Codec{256, 176, q45k_to_tile<48, false>, q45k_from_tile<48, false>};
    case TensorType::Q6_K:
      return qword ? Codec{256, 210, q6k_qword_to_tile, q6k_qword_from_tile} : Codec{256, 210, q6k_to_tile, q6k_from_tile};
    default: throw std::invalid_argument("no packed layout for " + type_name(type));
  }
}

}  // namespace

bool has_pack8_layout(TensorType type) {
  return type == TensorType::Q4_0 || type == TensorType::Q4_1 || type == TensorType::Q8_0 ||
         type == TensorType::IQ4_NL || type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q6_K ||
         type == TensorType::Q5_0 || type == TensorType::Q5_1;
}

void pack8_in_place(TensorType type, uint8_t* rows, int n_rows, int k, PackLayout layout) {
  if (n_rows % kPackRows != 0) throw std::invalid_argument("pack8: rows must be a multiple of 8");
  const Codec codec = codec_of(type, layout, k);
  const size_t rb = row_bytes(type, k);
  const int nb = k / codec.elements;
  std::vector<uint8_t> group(rb * kPackRows);
  for (int g = 0; g < n_rows / kPackRows; ++g) {
    uint8_t* dst = rows + static_cast<size_t>(g) * kPackRows * rb;
    std::memcpy(group.data(), dst, group.size());
    for (int b = 0; b < nb; ++b) {
      uint8_t* tile = dst + static_cast<size_t>(b) * kPackRows * codec.bytes;
      for (int c = 0; c < kPackRows; ++c) codec.to_tile(group.data() + c * rb + b * codec.bytes, c, tile);
    }
  }
}

void unpack8_row(TensorType type, const uint8_t* packed, int row, int k, uint8_t* out, PackLayout layout) {
  const Codec codec = codec_of(type, layout, k);
  const size_t rb = row_bytes(type, k);
  const uint8_t* group = packed + static_cast<size_t>(row / kPackRows) * kPackRows * rb;
  for (int b = 0; b < k / codec.elements; ++b) {
    codec.from_tile(group + static_cast<size_t>(b) * kPackRows * codec.bytes, row % kPackRows, out + b * codec.bytes);
  }
}

}  // namespace llmd::kernels
