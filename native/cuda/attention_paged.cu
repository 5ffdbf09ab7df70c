// paged_attention (attention.h): attention that reads the KV blocks in place through each
// sequence's block table. Three kernels, picked by the batch's host-side ints only (so a decode
// step captured in a CUDA graph replays correctly as its sequences grow):
//  - decode_split (max_q_rows == 1, head_dim 64/128): flash-decoding. One thread block per
//    (split of 64 * blocks_per_split positions, KV head [x chunk of its query heads], sequence):
//    every query head sharing the KV head is scored against each K/V row while it is in
//    registers, so a KV row is read once per step, with 16-byte loads. Splits past a sequence's
//    length exit at once; with more than one split, a small combine kernel merges the partials.
//  - prefill_flash_mma (longer query chunks, head_dim 64/128): FlashAttention-2 on the tensor
//    cores (mma.sync m16n8k16, float16 in, float32 accumulate), a tile of 64 query rows x one
//    64-position KV block per step, K/V double-buffered with cp.async, online softmax, causal
//    mask from each sequence's q_pos0. Decode rows of other sequences in the same step run as
//    1-row tiles of the same kernel.
//  - generic (other head dims): a plain one-row-per-block kernel, correct, not fast.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "cuda_check.h"

namespace llmd::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
// The running max starts finite: exp2(m_old - m_new) is then never exp2(-inf - -inf) = NaN, and
// masked scores (-inf, or weights forced to 0) contribute exactly nothing.
constexpr float kNegBig = -1e30f;
constexpr int kThreads = 128;

// ---------------------------------------------------------------------------------------------
// Decode: flash-decoding over the paged KV.

// Decode split plan: a function of the batch's host ints, n_heads and the SM count only (the
// workspace size must not depend on n_kv_heads, which attention_workspace_bytes is not given).
struct DecodePlan {
  int blocks_per_split;
  int num_splits;
};

int sm_count() {
  static const int count = [] {
    int dev = 0, n = 0;
    LLMD_CUDA_CHECK(cudaGetDevice(&dev));
    LLMD_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n > 0 ? n : 1;
  }();
  return count;
}

DecodePlan decode_plan(const AttentionBatch& b, int n_heads) {
  // Aim at ~2 waves of thread blocks assuming ~4 query heads per KV head (the common GQA
  // ratio; the estimate only steers the split length). At most 16 blocks (1024 positions) per
  // split, so a table sized far beyond the real lengths still spreads work over the chip.
  const long target_ctas = 2L * sm_count();
  const long per_split = std::max(1L, static_cast<long>(b.num_seqs) * std::max(1, n_heads / 4));
  const long splits_wanted = std::max(1L, (target_ctas + per_split - 1) / per_split);
  const int max_blocks = std::max(1, b.max_blocks_per_seq);
  int bps = static_cast<int>((max_blocks + splits_wanted - 1) / splits_wanted);
  bps = std::clamp(bps, 1, 16);
  // A few sequences: one 64-position block per split. The table is sized for the longest context, so
  // the plan above would give a short sequence one busy split per KV head (8 CTAs for an 8B model at
  // batch 1: 9.9 us at 512 positions on an H200); splits past a sequence's end exit at once.
  // (At most 256 splits, which bounds the workspace for tables of long contexts.)
  if (b.num_seqs <= 8) bps = std::min(bps, std::max(1, (max_blocks + 255) / 256));
  return {bps, (max_blocks + bps - 1) / bps};
}

// q/k/v of one 16-byte chunk of 8 float16 values.
__device__ __forceinline__ void half8_to_float(const uint4& u, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// Grid: (num_splits, n_kv * n_chunks, num_seqs); 128 threads. D / 8 consecutive threads (a
// "group") own one key at a time, 8 dims each; a group reads KPI consecutive keys per iteration
// (same KV block: splits start at multiples of 64). GC query heads per block (the chunk of the
// KV head's `group` query heads; GC is a power of two >= the chunk, surplus heads compute on
// zeros and are not stored).
template <int D, int GC>
__global__ void __launch_bounds__(kThreads)
    decode_split_kernel(const float* __restrict__ q, int ld_q, const int32_t* __restrict__ q_start,
                        const int32_t* __restrict__ q_pos0, const int32_t* __restrict__ block_table, int max_blocks,
                        const __half* __restrict__ kc, const __half* __restrict__ vc, int n_kv, int group,
                        int n_chunks, int n_heads, float qscale, int split_positions, int num_splits,
                        float* __restrict__ out, int ld_out, float* __restrict__ ws_m, float* __restrict__ ws_l,
                        float* __restrict__ ws_o) {
  constexpr int TPK = D / 8;       // threads per key
  constexpr int NG = kThreads / TPK;  // key groups per block
  constexpr int KPI = 4;           // keys per group per iteration
  static_assert(kKvBlockTokens % KPI == 0 && TPK <= 32 && 32 % TPK == 0, "decode layout");

  const int split = blockIdx.x;
  const int kvh = blockIdx.y / n_chunks;
  const int chunk = blockIdx.y - kvh * n_chunks;
  const int s = blockIdx.z;
  const int row = q_start[s];
  if (q_start[s + 1] - row < 1) return;  // a sequence with no query row this step
  const int len = q_pos0[s] + 1;         // the one row attends to positions [0, q_pos0]
  const int start = split * split_positions;
  if (start >= len) return;  // a split past this sequence's length (uniform over the block)
  const int end = min(start + split_positions, len);

  const int tid = threadIdx.x;
  const int grp = tid / TPK;
  const int lig = tid - grp * TPK;  // lane in group: dims [8 lig, 8 lig + 8)
  const int h0 = kvh * group + chunk * GC;
  const int nh = min(GC, group - chunk * GC);

  float qr[GC][8];
#pragma unroll
  for (int j = 0; j < GC; ++j) {
    const float* qh = q + static_cast<size_t>(row) * ld_q + static_cast<size_t>(h0 + j) * D + lig * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) qr[j][i] = j < nh ? qh[i] * qscale : 0.0f;
  }
  float m[GC], l[GC], acc[GC][8];
#pragma unroll
  for (int j = 0; j < GC; ++j) {
    m[j] = kNegBig;
    l[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[j][i] = 0.0f;
  }

  const int32_t* table = block_table + static_cast<size_t>(s) * max_blocks;
  const size_t head_stride = static_cast<size_t>(kKvBlockTokens) * D;
  // The trip count is uniform over the block (shuffles below need whole warps); each group
  // masks its own keys past `end`.
  for (int it = start; it < end; it += NG * KPI) {
    const int base = it + grp * KPI;
    uint4 kr[KPI], vr[KPI];
    if (base < end) {
      const int blk = table[base / kKvBlockTokens];
      const size_t off =
          (static_cast<size_t>(blk) * n_kv + kvh) * head_stride + static_cast<size_t>(base % kKvBlockTokens) * D + lig * 8;
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        if (base + u < end) {
          kr[u] = __ldg(reinterpret_cast<const uint4*>(kc + off + u * D));
          vr[u] = __ldg(reinterpret_cast<const uint4*>(vc + off + u * D));
        } else {
          kr[u] = make_uint4(0, 0, 0, 0);
          vr[u] = make_uint4(0, 0, 0, 0);
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        kr[u] = make_uint4(0, 0, 0, 0);
        vr[u] = make_uint4(0, 0, 0, 0);
      }
    }
    float sc[KPI][GC];
#pragma unroll
    for (int u = 0; u < KPI; ++u) {
      float kf[8];
      half8_to_float(kr[u], kf);
#pragma unroll
      for (int j = 0; j < GC; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) d = fmaf(qr[j][i], kf[i], d);
#pragma unroll
        for (int o = TPK / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
        sc[u][j] = d;
      }
    }
    float vf[KPI][8];
#pragma unroll
    for (int u = 0; u < KPI; ++u) half8_to_float(vr[u], vf[u]);
#pragma unroll
    for (int j = 0; j < GC; ++j) {
      float mx = m[j];
#pragma unroll
      for (int u = 0; u < KPI; ++u)
        if (base + u < end) mx = fmaxf(mx, sc[u][j]);
      const float c = exp2f(m[j] - mx);
      float p[KPI];
      float ps = 0.0f;
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        p[u] = base + u < end ? exp2f(sc[u][j] - mx) : 0.0f;
        ps += p[u];
      }
      l[j] = l[j] * c + ps;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float a = acc[j][i] * c;
#pragma unroll
        for (int u = 0; u < KPI; ++u) a = fmaf(p[u], vf[u][i], a);
        acc[j][i] = a;
      }
      m[j] = mx;
    }
  }

  // Merge the NG groups' partial softmax states.
  __shared__ float red_m[NG][GC];
  __shared__ float red_l[NG][GC];
  __shared__ __align__(16) float red_o[NG][GC][D];
#pragma unroll
  for (int j = 0; j < GC; ++j) {
#pragma unroll
    for (int i = 0; i < 8; ++i) red_o[grp][j][lig * 8 + i] = acc[j][i];
    if (lig == 0) {
      red_m[grp][j] = m[j];
      red_l[grp][j] = l[j];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < nh * D; idx += kThreads) {
    const int j = idx / D;
    const int d = idx - j * D;
    float mx = kNegBig;
    for (int g = 0; g < NG; ++g) mx = fmaxf(mx, red_m[g][j]);
    float L = 0.0f, O = 0.0f;
    for (int g = 0; g < NG; ++g) {
      const float w = exp2f(red_m[g][j] - mx);  // 0 for a group that saw no key (m = kNegBig)
      L = fmaf(red_l[g][j], w, L);
      O = fmaf(red_o[g][j][d], w, O);
    }
    const int h = h0 + j;
    if (num_splits == 1) {
      out[static_cast<size_t>(row) * ld_out + static_cast<size_t>(h) * D + d] = O / L;
    } else {
      const size_t p = (static_cast<size_t>(s) * n_heads + h) * num_splits + split;
      ws_o[p * D + d] = O;
      if (d == 0) {
        ws_m[p] = mx;
        ws_l[p] = L;
      }
    }
  }
}

// Merges the splits of one (head, sequence): grid (n_heads, num_seqs), D threads. Reads only
// the splits the decode kernel wrote (those starting below the sequence's length).
__global__ void __launch_bounds__(kThreads)
    decode_combine_kernel(const int32_t* __restrict__ q_start, const int32_t* __restrict__ q_pos0, int D, int n_heads,
                          int split_positions, int num_splits, const float* __restrict__ ws_m,
                          const float* __restrict__ ws_l, const float* __restrict__ ws_o, float* __restrict__ out,
                          int ld_out) {
  const int h = blockIdx.x;
  const int s = blockIdx.y;
  const int row = q_start[s];
  if (q_start[s + 1] - row < 1) return;
  const int len = q_pos0[s] + 1;
  const int nvalid = min(num_splits, (len + split_positions - 1) / split_positions);
  const size_t p0 = (static_cast<size_t>(s) * n_heads + h) * num_splits;
  float mx = kNegBig;
  for (int p = 0; p < nvalid; ++p) mx = fmaxf(mx, ws_m[p0 + p]);
  float L = 0.0f;
  for (int p = 0; p < nvalid; ++p) L = fmaf(ws_l[p0 + p], exp2f(ws_m[p0 + p] - mx), L);
  const float inv = 1.0f / L;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float O = 0.0f;
    for (int p = 0; p < nvalid; ++p) O = fmaf(ws_o[(p0 + p) * D + d], exp2f(ws_m[p0 + p] - mx), O);
    out[static_cast<size_t>(row) * ld_out + static_cast<size_t>(h) * D + d] = O * inv;
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill / mixed steps: FlashAttention-2 with mma.sync.

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t lds32(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Four 8x8 float16 matrices, transposed: lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// 16 bytes global -> shared, asynchronously; ok == false fills the 16 bytes with zeros instead
// (positions past the sequence: their slots may hold anything, NaN included, and 0 * NaN in the
// P V product would poison the row).
__device__ __forceinline__ void cp_async16(__half* smem, const __half* gmem, bool ok) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

constexpr int kPrefillBM = 64;  // query rows per block (4 warps x 16)
constexpr int kPrefillBN = kKvBlockTokens;  // keys per step: one KV block

template <int D>
constexpr size_t prefill_smem_bytes() {
  return static_cast<size_t>(kPrefillBM + 4 * kPrefillBN) * (D + 8) * sizeof(__half);
}

// Grid: (ceil(max_q_rows / 64), n_heads, num_seqs); 128 threads, warp w owns query rows
// [16 w, 16 w + 16) of the tile. Shared memory: Q [64][D+8], K and V [2][64][D+8] float16 (rows
// padded by 16 bytes: the fragment loads' 8 rows then fall on distinct banks).
template <int D>
__global__ void __launch_bounds__(kThreads)
    prefill_flash_kernel(const float* __restrict__ q, int ld_q, const int32_t* __restrict__ q_start,
                         const int32_t* __restrict__ q_pos0, const int32_t* __restrict__ block_table, int max_blocks,
                         const __half* __restrict__ kc, const __half* __restrict__ vc, int n_kv, int group,
                         float qscale, float* __restrict__ out, int ld_out) {
  constexpr int BM = kPrefillBM, BN = kPrefillBN, LDS = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + BM * LDS;
  __half* Vs = Ks + 2 * BN * LDS;

  const int h = blockIdx.y;
  const int s = blockIdx.z;
  const int row_begin = q_start[s];
  const int nrows = q_start[s + 1] - row_begin;
  // Highest query tiles (the most keys under the causal mask) first: the long blocks start in the
  // first wave and the short ones fill the tail.
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BM;
  if (r0 >= nrows) return;  // uniform over the block
  const int pos0 = q_pos0[s];
  const int kvh = h / group;
  const int rows_here = min(BM, nrows - r0);
  const int len = pos0 + r0 + rows_here;  // the tile's last row sees positions [0, len)
  const int ntiles = (len + BN - 1) / BN;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int32_t* table = block_table + static_cast<size_t>(s) * max_blocks;
  const size_t head_stride = static_cast<size_t>(BN) * D;

  auto load_kv = [&](int t, int stage) {
    const size_t base = (static_cast<size_t>(table[t]) * n_kv + kvh) * head_stride;
    const __half* ksrc = kc + base;
    const __half* vsrc = vc + base;
    __half* kdst = Ks + stage * BN * LDS;
    __half* vdst = Vs + stage * BN * LDS;
    constexpr int kChunksPerRow = D / 8;
    for (int c = tid; c < BN * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow;
      const int col = (c - r * kChunksPerRow) * 8;
      const bool ok = t * BN + r < len;
      cp_async16(kdst + r * LDS + col, ksrc + r * D + col, ok);
      cp_async16(vdst + r * LDS + col, vsrc + r * D + col, ok);
    }
  };
  load_kv(0, 0);
  cp_async_commit();

  // Q tile, pre-scaled by scale * log2(e) (the softmax then runs on exp2), float16; rows past
  // the sequence's chunk are zeros (computed, never stored).
  for (int idx = tid; idx < BM * D / 2; idx += kThreads) {
    const int r = idx / (D / 2);
    const int d = (idx - r * (D / 2)) * 2;
    float2 v = make_float2(0.0f, 0.0f);
    if (r < rows_here) {
      const float* src = q + static_cast<size_t>(row_begin + r0 + r) * ld_q + static_cast<size_t>(h) * D + d;
      v = make_float2(src[0] * qscale, src[1] * qscale);
    }
    *reinterpret_cast<__half2*>(Qs + r * LDS + d) = __floats2half2_rn(v.x, v.y);
  }

  const int g = lane >> 2;  // fragment row (and B column) within the 8-row group
  const int tq = lane & 3;  // thread in quad: fragment columns 2 tq, 2 tq + 1
  const int qpos_a = pos0 + r0 + warp * 16 + g;  // position of this thread's first row; second: +8
  const int qpos_b = qpos_a + 8;
  const int warp_last_pos = pos0 + r0 + warp * 16 + 15;
  // A warp holding only rows past the chunk (a decode row's 1-row tile) computes nothing.
  const bool warp_active = warp * 16 < rows_here;

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_a = kNegBig, m_b = kNegBig, l_a = 0.0f, l_b = 0.0f;

  for (int t = 0; t < ntiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < ntiles) {
      load_kv(t + 1, stage ^ 1);  // that stage was last read in step t - 1, before its closing barrier
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
      const __half* qa = Qs + (warp * 16 + g) * LDS + tq * 2;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        qf[kk][0] = lds32(qa + kk * 16);
        qf[kk][1] = lds32(qa + 8 * LDS + kk * 16);
        qf[kk][2] = lds32(qa + kk * 16 + 8);
        qf[kk][3] = lds32(qa + 8 * LDS + kk * 16 + 8);
      }
    }
    // A warp whose rows all precede this block's first key has nothing to add (warp-uniform).
    if (warp_active && t * BN <= warp_last_pos) {
      const __half* Kst = Ks + stage * BN * LDS;
      const __half* Vst = Vs + stage * BN * LDS;
      float sc[BN / 8][4];
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          const __half* kp = Kst + (nt * 8 + g) * LDS + kk * 16 + tq * 2;
          mma_16816(sc[nt], qf[kk], lds32(kp), lds32(kp + 8));
        }
      }
      // Causal mask and the running max of rows a (g) and b (g + 8).
      const int kbase = t * BN + tq * 2;
      float mx_a = m_a, mx_b = m_b;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kp = kbase + nt * 8 + e;
          if (kp > qpos_a) sc[nt][e] = -INFINITY;
          if (kp > qpos_b) sc[nt][2 + e] = -INFINITY;
          mx_a = fmaxf(mx_a, sc[nt][e]);
          mx_b = fmaxf(mx_b, sc[nt][2 + e]);
        }
      }
#pragma unroll
      for (int off = 1; off <= 2; off *= 2) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
      }
      const float c_a = exp2f(m_a - mx_a);
      const float c_b = exp2f(m_b - mx_b);
      m_a = mx_a;
      m_b = mx_b;
      // P as the A operand of P V: the S accumulator of key tiles 2kk and 2kk+1 is exactly the
      // A fragment of k-step kk (FlashAttention-2's register reuse).
      uint32_t pf[BN / 16][4];
      float rs_a = 0.0f, rs_b = 0.0f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        const float p0 = exp2f(sc[nt][0] - mx_a);
        const float p1 = exp2f(sc[nt][1] - mx_a);
        const float p2 = exp2f(sc[nt][2] - mx_b);
        const float p3 = exp2f(sc[nt][3] - mx_b);
        rs_a += p0 + p1;
        rs_b += p2 + p3;
        const __half2 pa = __floats2half2_rn(p0, p1);
        const __half2 pb = __floats2half2_rn(p2, p3);
        pf[nt / 2][(nt & 1) * 2 + 0] = *reinterpret_cast<const uint32_t*>(&pa);
        pf[nt / 2][(nt & 1) * 2 + 1] = *reinterpret_cast<const uint32_t*>(&pb);
      }
      l_a = l_a * c_a + rs_a;
      l_b = l_b * c_b + rs_b;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        o[dn][0] *= c_a;
        o[dn][1] *= c_a;
        o[dn][2] *= c_b;
        o[dn][3] *= c_b;
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, Vst + (kk * 16 + (lane & 15)) * LDS + dp * 16 + (lane >> 4) * 8);
          mma_16816(o[2 * dp], pf[kk], b[0], b[1]);
          mma_16816(o[2 * dp + 1], pf[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before step t + 1 refills it
  }

#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  const int row_a = r0 + warp * 16 + g;  // chunk-relative
  const int row_b = row_a + 8;
  const float inv_a = 1.0f / l_a;
  const float inv_b = 1.0f / l_b;
  float* out_a = out + static_cast<size_t>(row_begin + row_a) * ld_out + static_cast<size_t>(h) * D + tq * 2;
  float* out_b = out + static_cast<size_t>(row_begin + row_b) * ld_out + static_cast<size_t>(h) * D + tq * 2;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    if (row_a < nrows) {
      out_a[dn * 8] = o[dn][0] * inv_a;
      out_a[dn * 8 + 1] = o[dn][1] * inv_a;
    }
    if (row_b < nrows) {
      out_b[dn * 8] = o[dn][2] * inv_b;
      out_b[dn * 8 + 1] = o[dn][3] * inv_b;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Generic: any head_dim up to kGenericMaxDim, one block per (query row, head). Correctness path.

constexpr int kGenericMaxDim = 512;

__device__ float block_reduce(float v, bool is_max, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x / 32;
  __syncthreads();  // scratch's previous readers are done
  if ((threadIdx.x & 31) == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

// Grid: (max_q_rows, n_heads, num_seqs); 128 threads, one key per thread per chunk of 128.
__global__ void __launch_bounds__(kThreads)
    generic_attention_kernel(const float* __restrict__ q, int ld_q, const int32_t* __restrict__ q_start,
                             const int32_t* __restrict__ q_pos0, const int32_t* __restrict__ block_table,
                             int max_blocks, const __half* __restrict__ kc, const __half* __restrict__ vc, int n_kv,
                             int group, int D, float qscale, float* __restrict__ out, int ld_out) {
  __shared__ float qs[kGenericMaxDim];
  __shared__ float acc[kGenericMaxDim];
  __shared__ float ps[kThreads];
  __shared__ float scratch[kThreads / 32];
  const int r = blockIdx.x;
  const int h = blockIdx.y;
  const int s = blockIdx.z;
  const int row_begin = q_start[s];
  if (r >= q_start[s + 1] - row_begin) return;
  const int row = row_begin + r;
  const int nkeys = q_pos0[s] + r + 1;
  const int kvh = h / group;
  const int tid = threadIdx.x;
  for (int d = tid; d < D; d += kThreads) {
    qs[d] = q[static_cast<size_t>(row) * ld_q + static_cast<size_t>(h) * D + d] * qscale;
    acc[d] = 0.0f;
  }
  __syncthreads();
  const int32_t* table = block_table + static_cast<size_t>(s) * max_blocks;
  auto slot_of = [&](int key) {
    return ((static_cast<size_t>(table[key / kKvBlockTokens]) * n_kv + kvh) * kKvBlockTokens + key % kKvBlockTokens) *
           D;
  };
  float m = kNegBig, l = 0.0f;
  for (int c0 = 0; c0 < nkeys; c0 += kThreads) {
    const int key = c0 + tid;
    float sc = kNegBig;
    if (key < nkeys) {
      const __half* kp = kc + slot_of(key);
      float d = 0.0f;
      for (int i = 0; i < D; ++i) d = fmaf(qs[i], __half2float(kp[i]), d);
      sc = d;
    }
    const float mx = fmaxf(m, block_reduce(sc, true, scratch));
    const float c = exp2f(m - mx);
    const float p = key < nkeys ? exp2f(sc - mx) : 0.0f;
    l = l * c + block_reduce(p, false, scratch);
    ps[tid] = p;
    __syncthreads();
    const int n = min(kThreads, nkeys - c0);
    for (int d = tid; d < D; d += kThreads) {
      float a = acc[d] * c;
      for (int k = 0; k < n; ++k) a = fmaf(ps[k], __half2float(vc[slot_of(c0 + k) + d]), a);
      acc[d] = a;
    }
    m = mx;
    __syncthreads();  // ps is rewritten next chunk
  }
  for (int d = tid; d < D; d += kThreads)
    out[static_cast<size_t>(row) * ld_out + static_cast<size_t>(h) * D + d] = acc[d] / l;
}

// ---------------------------------------------------------------------------------------------

bool fast_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128; }
bool decode_batch(const AttentionBatch& b) { return b.max_q_rows <= 1; }

template <int D, int GC>
void launch_decode(const float* q, int ld_q, const AttentionBatch& b, const LayerKv& kv, int n_heads, float qscale,
                   float* out, int ld_out, const DecodePlan& plan, float* ws, cudaStream_t stream) {
  const int group = n_heads / kv.n_kv_heads;
  const int n_chunks = (group + GC - 1) / GC;
  const dim3 grid(plan.num_splits, kv.n_kv_heads * n_chunks, b.num_seqs);
  const size_t parts = static_cast<size_t>(b.num_seqs) * n_heads * plan.num_splits;
  float* ws_m = ws;
  float* ws_l = ws == nullptr ? nullptr : ws + parts;
  float* ws_o = ws == nullptr ? nullptr : ws + 2 * parts;
  const int split_positions = plan.blocks_per_split * kKvBlockTokens;
  decode_split_kernel<D, GC><<<grid, kThreads, 0, stream>>>(
      q, ld_q, b.q_start, b.q_pos0, b.block_table, b.max_blocks_per_seq, kv.k, kv.v, kv.n_kv_heads, group, n_chunks,
      n_heads, qscale, split_positions, plan.num_splits, out, ld_out, ws_m, ws_l, ws_o);
  LLMD_CUDA_CHECK_LAUNCH();
  if (plan.num_splits > 1) {
    decode_combine_kernel<<<dim3(n_heads, b.num_seqs), D, 0, stream>>>(b.q_start, b.q_pos0, D, n_heads,
                                                                       split_positions, plan.num_splits, ws_m, ws_l,
                                                                       ws_o, out, ld_out);
    LLMD_CUDA_CHECK_LAUNCH();
  }
}

template <int D>
void dispatch_decode(const float* q, int ld_q, const AttentionBatch& b, const LayerKv& kv, int n_heads, float qscale,
                     float* out, int ld_out, const DecodePlan& plan, float* ws, cudaStream_t stream) {
  const int group = n_heads / kv.n_kv_heads;
  if (group == 1)
    launch_decode<D, 1>(q, ld_q, b, kv, n_heads, qscale, out, ld_out, plan, ws, stream);
  else if (group == 2)
    launch_decode<D, 2>(q, ld_q, b, kv, n_heads, qscale, out, ld_out, plan, ws, stream);
  else if (group <= 4)
    launch_decode<D, 4>(q, ld_q, b, kv, n_heads, qscale, out, ld_out, plan, ws, stream);
  else
    launch_decode<D, 8>(q, ld_q, b, kv, n_heads, qscale, out, ld_out, plan, ws, stream);
}

template <int D>
void launch_prefill(const float* q, int ld_q, const AttentionBatch& b, const LayerKv& kv, int n_heads, float qscale,
                    float* out, int ld_out, cudaStream_t stream) {
  constexpr size_t smem = prefill_smem_bytes<D>();
  static const bool attr_set = [] {
    LLMD_CUDA_CHECK(cudaFuncSetAttribute(prefill_flash_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    return true;
  }();
  (void)attr_set;
  const dim3 grid((b.max_q_rows + kPrefillBM - 1) / kPrefillBM, n_heads, b.num_seqs);
  prefill_flash_kernel<D><<<grid, kThreads, smem, stream>>>(q, ld_q, b.q_start, b.q_pos0, b.block_table,
                                                            b.max_blocks_per_seq, kv.k, kv.v, kv.n_kv_heads,
                                                            n_heads / kv.n_kv_heads, qscale, out, ld_out);
  LLMD_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t attention_workspace_bytes(const AttentionBatch& batch, int n_heads, int head_dim) {
  if (batch.num_seqs <= 0 || !decode_batch(batch) || !fast_head_dim(head_dim)) return 0;
  const DecodePlan plan = decode_plan(batch, n_heads);
  if (plan.num_splits <= 1) return 0;
  const size_t parts = static_cast<size_t>(batch.num_seqs) * n_heads * plan.num_splits;
  return parts * (2 + static_cast<size_t>(head_dim)) * sizeof(float);
}

void paged_attention(const float* q, int ld_q, const AttentionBatch& batch, const LayerKv& kv, int n_heads,
                     float scale, float* out, int ld_out, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  if (batch.num_seqs <= 0 || batch.total_q_rows <= 0) return;
  const int D = kv.head_dim;
  if (kv.n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv.n_kv_heads != 0)
    throw std::runtime_error("paged_attention: n_heads " + std::to_string(n_heads) + " is not a multiple of " +
                             std::to_string(kv.n_kv_heads) + " KV heads");
  if (D <= 0 || D > kGenericMaxDim || D % 2 != 0)
    throw std::runtime_error("paged_attention: head_dim " + std::to_string(D) + " unsupported (even, <= " +
                             std::to_string(kGenericMaxDim) + ")");
  if (ld_q < n_heads * D || ld_out < n_heads * D)
    throw std::runtime_error("paged_attention: row strides shorter than n_heads * head_dim");
  if (batch.max_blocks_per_seq <= 0) throw std::runtime_error("paged_attention: max_blocks_per_seq must be > 0");
  if (batch.num_seqs > 65535) throw std::runtime_error("paged_attention: more than 65535 sequences");
  const float qscale = scale * kLog2e;

  if (!fast_head_dim(D)) {
    const dim3 grid(std::max(1, batch.max_q_rows), n_heads, batch.num_seqs);
    generic_attention_kernel<<<grid, kThreads, 0, stream>>>(q, ld_q, batch.q_start, batch.q_pos0, batch.block_table,
                                                            batch.max_blocks_per_seq, kv.k, kv.v, kv.n_kv_heads,
                                                            n_heads / kv.n_kv_heads, D, qscale, out, ld_out);
    LLMD_CUDA_CHECK_LAUNCH();
    return;
  }
  if (decode_batch(batch)) {
    const DecodePlan plan = decode_plan(batch, n_heads);
    const size_t need = attention_workspace_bytes(batch, n_heads, D);
    if (need > 0 && (workspace == nullptr || workspace_bytes < need))
      throw std::runtime_error("paged_attention: workspace of " + std::to_string(workspace_bytes) +
                               " bytes, the decode splits need " + std::to_string(need));
    float* ws = need > 0 ? static_cast<float*>(workspace) : nullptr;
    if (D == 64)
      dispatch_decode<64>(q, ld_q, batch, kv, n_heads, qscale, out, ld_out, plan, ws, stream);
    else
      dispatch_decode<128>(q, ld_q, batch, kv, n_heads, qscale, out, ld_out, plan, ws, stream);
    return;
  }
  if (D == 64)
    launch_prefill<64>(q, ld_q, batch, kv, n_heads, qscale, out, ld_out, stream);
  else
    launch_prefill<128>(q, ld_q, batch, kv, n_heads, qscale, out, ld_out, stream);
}

const char* attention_path(const AttentionBatch& batch, int head_dim) {
  if (!fast_head_dim(head_dim)) return decode_batch(batch) ? "decode_generic" : "prefill_generic";
  return decode_batch(batch) ? "decode_split" : "prefill_flash_mma";
}

}  // namespace llmd::cuda
