// Benchmarks of attention.h at Llama-3-8B's attention shapes (32 heads, 8 KV heads, head_dim
// 128): decode at batch 1 and 32 with 512 and 4096 positions (GB/s of KV read: K and V of every
// position once), rope_write_kv at batch 1 and 32, prefill of 512 and 4096 tokens of one
// sequence (TFLOP/s of the causal half: 4 * head_dim * n_heads * N (N + 1) / 2).
// Timing: CUDA events around groups of launches after a warm-up, median of the groups; decode
// rotates over disjoint KV block sets totalling >= 256 MiB so no call finds its KV in the L2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../attention.h"
#include "../device_buffer.h"
#include "cuda_test.h"

namespace llmd::cuda {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr int kWidth = (kHeads + 2 * kKvHeads) * kDim;

// Fills a device buffer with pseudo-random float16 in [-1, 1) (never zeros) in 64 MiB pieces.
void fill_halves(DeviceBuffer& b, uint32_t seed) {
  const size_t n = b.bytes() / 2;
  const size_t piece = std::min<size_t>(n, size_t(32) << 20);
  std::vector<uint16_t> h(piece);
  uint32_t x = seed | 1u;
  for (auto& v : h) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    // exponent 14 or 13 (values in [2^-2, 1)), random sign and mantissa
    v = static_cast<uint16_t>((x & 0x8000u) | ((13u + ((x >> 16) & 1u)) << 10) | ((x >> 3) & 0x3FFu));
  }
  for (size_t at = 0; at < n; at += piece) b.upload(h.data(), std::min(piece, n - at) * 2, at * 2);
}

void fill_floats(DeviceBuffer& b, uint32_t seed) {
  std::vector<float> h(b.bytes() / 4);
  uint32_t x = seed | 1u;
  for (auto& v : h) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>((x >> 8) & 0xFFFF) / 32768.0f - 1.0f + 1.0f / 65536.0f;
  }
  b.upload(h.data(), h.size() * 4);
}

// Median microseconds per call of fn(i) over `samples` groups of `per_sample` calls.
template <typename Fn>
double median_us(Fn fn, int warmup, int samples, int per_sample) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t a, b;
  LLMD_CUDA_CHECK(cudaEventCreate(&a));
  LLMD_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  int call = 0;
  for (int s = 0; s < samples; ++s) {
    LLMD_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < per_sample; ++i) fn(call++);
    LLMD_CUDA_CHECK(cudaEventRecord(b));
    LLMD_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LLMD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1000.0 * ms / per_sample);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
DeviceBuffer upload_vec(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

void bench_decode(int batch, int ctx) {
  const int bps = (ctx + kKvBlockTokens - 1) / kKvBlockTokens;
  const int needed = batch * bps;
  const size_t block_bytes = size_t(2) * kKvHeads * kKvBlockTokens * kDim * 2;  // K and V
  const int sets = std::max<int>(1, static_cast<int>((size_t(256) << 20) / (block_bytes * needed)));
  const int num_blocks = sets * needed;
  const size_t kv_elems = static_cast<size_t>(num_blocks) * kKvHeads * kKvBlockTokens * kDim;
  DeviceBuffer k(kv_elems * 2), v(kv_elems * 2);
  fill_halves(k, 1);
  fill_halves(v, 2);
  const LayerKv kv{k.as<__half>(), v.as<__half>(), num_blocks, kKvHeads, kDim};
  std::vector<int32_t> tables(static_cast<size_t>(sets) * needed);
  for (int i = 0; i < sets * needed; ++i) tables[i] = i;  // set r owns blocks [r needed, (r+1) needed)
  std::vector<int32_t> q_start(batch + 1), q_pos0(batch, ctx - 1);
  for (int i = 0; i <= batch; ++i) q_start[i] = i;
  DeviceBuffer d_tables = upload_vec(tables), d_qs = upload_vec(q_start), d_qp = upload_vec(q_pos0);
  DeviceBuffer q(static_cast<size_t>(batch) * kWidth * 4), out(static_cast<size_t>(batch) * kHeads * kDim * 4);
  fill_floats(q, 3);
  AttentionBatch b;
  b.num_seqs = batch;
  b.total_q_rows = batch;
  b.max_q_rows = 1;
  b.max_blocks_per_seq = bps;
  b.q_start = d_qs.as<int32_t>();
  b.q_pos0 = d_qp.as<int32_t>();
  const size_t ws_bytes = attention_workspace_bytes(b, kHeads, kDim);
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 16));
  const float scale = 1.0f / std::sqrt(float(kDim));
  const double us = median_us(
      [&](int i) {
        AttentionBatch bi = b;
        bi.block_table = d_tables.as<int32_t>() + static_cast<size_t>(i % sets) * needed;
        paged_attention(q.as<float>(), kWidth, bi, kv, kHeads, scale, out.as<float>(), kHeads * kDim, ws.get(),
                        ws_bytes, nullptr);
      },
      5, 30, 10);
  const double bytes = double(batch) * ctx * kKvHeads * kDim * 2 * 2;
  const std::string what = "decode b=" + std::to_string(batch) + " ctx=" + std::to_string(ctx);
  testing::report(what + " (" + attention_path(b, kDim) + ", " + std::to_string(sets) + " KV sets)", us, "us");
  testing::report(what + " KV read", bytes / us * 1e-3, "GB/s");
}

void bench_rope(int rows) {
  const int num_blocks = std::max(1, rows);
  DeviceBuffer k(static_cast<size_t>(num_blocks) * kKvHeads * kKvBlockTokens * kDim * 2), v(k.bytes());
  const LayerKv kv{k.as<__half>(), v.as<__half>(), num_blocks, kKvHeads, kDim};
  std::vector<float> inv(kDim / 2);
  for (int i = 0; i < kDim / 2; ++i) inv[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / kDim));
  std::vector<int32_t> pos(rows), slots(rows);
  for (int r = 0; r < rows; ++r) {
    pos[r] = 1000 + 37 * r;
    slots[r] = r * kKvBlockTokens + (r % kKvBlockTokens);
  }
  DeviceBuffer d_inv = upload_vec(inv), d_pos = upload_vec(pos), d_slots = upload_vec(slots);
  DeviceBuffer qkv(static_cast<size_t>(rows) * kWidth * 4);
  fill_floats(qkv, 4);
  const Rope rope{d_inv.as<float>(), kDim, true};
  const double us = median_us(
      [&](int) {
        rope_write_kv(qkv.as<float>(), kWidth, rows, kHeads, d_pos.as<int32_t>(), d_slots.as<int32_t>(), rope, kv,
                      nullptr);
      },
      5, 30, 20);
  testing::report("rope_write_kv rows=" + std::to_string(rows), us, "us");
}

void bench_prefill(int n) {
  const int bps = (n + kKvBlockTokens - 1) / kKvBlockTokens;
  const size_t kv_elems = static_cast<size_t>(bps) * kKvHeads * kKvBlockTokens * kDim;
  DeviceBuffer k(kv_elems * 2), v(kv_elems * 2);
  fill_halves(k, 5);
  fill_halves(v, 6);
  const LayerKv kv{k.as<__half>(), v.as<__half>(), bps, kKvHeads, kDim};
  std::vector<int32_t> table(bps), q_start{0, n}, q_pos0{0};
  for (int j = 0; j < bps; ++j) table[j] = bps - 1 - j;  // reversed: not contiguous in memory order
  DeviceBuffer d_table = upload_vec(table), d_qs = upload_vec(q_start), d_qp = upload_vec(q_pos0);
  DeviceBuffer q(static_cast<size_t>(n) * kWidth * 4), out(static_cast<size_t>(n) * kHeads * kDim * 4);
  fill_floats(q, 7);
  AttentionBatch b;
  b.num_seqs = 1;
  b.total_q_rows = n;
  b.max_q_rows = n;
  b.max_blocks_per_seq = bps;
  b.q_start = d_qs.as<int32_t>();
  b.q_pos0 = d_qp.as<int32_t>();
  b.block_table = d_table.as<int32_t>();
  const float scale = 1.0f / std::sqrt(float(kDim));
  const double us = median_us(
      [&](int) {
        paged_attention(q.as<float>(), kWidth, b, kv, kHeads, scale, out.as<float>(), kHeads * kDim, nullptr, 0,
                        nullptr);
      },
      3, 15, 4);
  const double flops = 4.0 * kDim * kHeads * (double(n) * (n + 1) / 2);
  const std::string what = "prefill n=" + std::to_string(n);
  testing::report(what + " (" + attention_path(b, kDim) + ")", us, "us");
  testing::report(what + " causal", flops / us * 1e-6, "TFLOP/s");
}

LLMD_CUDA_BENCH(attention_decode_8b) {
  for (int batch : {1, 32})
    for (int ctx : {512, 4096}) bench_decode(batch, ctx);
}
LLMD_CUDA_BENCH(attention_rope_write_kv_8b) {
  for (int rows : {1, 32}) bench_rope(rows);
}
LLMD_CUDA_BENCH(attention_prefill_8b) {
  for (int n : {512, 4096}) bench_prefill(n);
}

}  // namespace
}  // namespace llmd::cuda
