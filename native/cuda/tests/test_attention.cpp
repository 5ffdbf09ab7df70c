// Tests of attention.h against a CPU reference in double: rope_write_kv writes this step's KV
// beside KV written by an earlier "step", then paged_attention reads both through shuffled,
// non-contiguous block tables. Every case prints its relative errors; a failure names the first
// bad element (sequence, row, head, dim, got, expected) so one GPU run pinpoints the bug.
//
// Poisoning: the whole KV pool starts as float16 NaN (so a read past a sequence's length, or of
// a block-table entry past it, shows as NaN), spare block-table entries point at poisoned blocks,
// outputs and workspace start as NaN, and the columns of out beyond n_heads * head_dim must stay
// NaN (no write past a row).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../core/fp16.h"
#include "../attention.h"
#include "../device_buffer.h"
#include "cuda_test.h"

namespace llmd::cuda {
namespace {

using testing::rng;

struct SeqSpec {
  int q_pos0;
  int rows;
};

struct AttnCase {
  const char* name;
  int n_heads, n_kv, head_dim;
  int rope_dims;
  bool interleaved;
  double theta;
  std::vector<SeqSpec> seqs;
  int extra_table = 0;  // block-table entries past the longest sequence (a graph-sized table)
  const char* expect_path = nullptr;
  // Run this step as a CUDA graph captured while the device arrays held another step's contents
  // (every q_pos0 0, positions/slots of a shorter past), then replayed with the real ones: the
  // engine captures decode steps once and replays them as sequences grow.
  bool graph = false;
};

// Owns a stream, a graph and its instance for one test (released on any exit path).
struct GraphRun {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphRun() { LLMD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~GraphRun() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  GraphRun(const GraphRun&) = delete;
  GraphRun& operator=(const GraphRun&) = delete;
};

template <typename T>
DeviceBuffer upload_vec(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  LLMD_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Rotates x (one head) in double by the float angle float(pos) * inv_freq[i], as the kernel does.
void ref_rope(double* x, int pos, const std::vector<float>& inv_freq, int dims, bool interleaved) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const double c = std::cos(static_cast<double>(angle));
    const double s = std::sin(static_cast<double>(angle));
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

// Relative error of got vs ref; on exceeding `tol`, the first element off by more than
// 10 * tol * rms(ref) (or not finite) described through `where`.
template <typename Where>
void check_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref, double tol,
                 Where where) {
  double num = 0, den = 0;
  bool finite = true;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) finite = false;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double rms = std::sqrt(den / std::max<size_t>(1, ref.size()));
  const double rel = finite ? std::sqrt(num / (den > 0 ? den : 1.0)) : INFINITY;
  std::printf("    %-28s rel err %.3e (tol %.0e, %zu values)\n", what, rel, tol, got.size());
  if (rel <= tol) return;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > 10 * tol * rms) {
      LLMD_EXPECT(false, what << ": rel err " << rel << "; first bad element " << where(i) << ": got " << got[i]
                              << " expected " << ref[i]);
    }
  }
  LLMD_EXPECT(false, what << ": rel err " << rel << " (spread thin: no single element far off)");
}

void run_case(const AttnCase& c) {
  auto& gen = rng();
  const int H = c.n_heads, HK = c.n_kv, D = c.head_dim;
  const int width = (H + 2 * HK) * D;
  const int ld = width + 3;           // odd strides: no kernel may assume aligned rows
  const int ld_out = H * D + 5;
  const int S = static_cast<int>(c.seqs.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::uniform_real_distribution<float> u2(-2.0f, 2.0f), u1(-1.0f, 1.0f);

  // Block ids: every sequence's blocks drawn from one shuffled pool; 3 spare (poisoned) blocks
  // fill the table past each sequence's length.
  std::vector<int> len(S), nblk(S);
  int total_blocks = 0, max_blocks = 0, max_rows = 0, total_rows = 0;
  for (int s = 0; s < S; ++s) {
    len[s] = c.seqs[s].q_pos0 + c.seqs[s].rows;
    nblk[s] = (len[s] + kKvBlockTokens - 1) / kKvBlockTokens;
    total_blocks += nblk[s];
    max_blocks = std::max(max_blocks, nblk[s]);
    max_rows = std::max(max_rows, c.seqs[s].rows);
    total_rows += c.seqs[s].rows;
  }
  max_blocks += c.extra_table;
  const int num_blocks = total_blocks + 3;
  std::vector<int> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), gen);
  std::vector<int32_t> table(static_cast<size_t>(S) * max_blocks);
  {
    int next = 0;
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < max_blocks; ++j)
        table[static_cast<size_t>(s) * max_blocks + j] = j < nblk[s] ? ids[next++] : ids[total_blocks + (j % 3)];
  }

  // Every position's q|k|v (q of the old positions is rotated too, and ignored).
  std::vector<std::vector<float>> data(S);
  for (int s = 0; s < S; ++s) {
    data[s].resize(static_cast<size_t>(len[s]) * width);
    for (int p = 0; p < len[s]; ++p) {
      float* r = data[s].data() + static_cast<size_t>(p) * width;
      for (int i = 0; i < (H + HK) * D; ++i) r[i] = u2(gen);
      for (int i = (H + HK) * D; i < width; ++i) r[i] = u1(gen);
    }
  }
  std::vector<float> inv_freq(std::max(1, c.rope_dims / 2));
  for (int i = 0; i < c.rope_dims / 2; ++i)
    inv_freq[i] = static_cast<float>(std::pow(c.theta, -2.0 * i / c.rope_dims));
  DeviceBuffer d_inv = upload_vec(inv_freq);
  const Rope rope{d_inv.as<float>(), c.rope_dims, c.interleaved};

  const size_t kv_elems = static_cast<size_t>(num_blocks) * HK * kKvBlockTokens * D;
  DeviceBuffer d_k(kv_elems * 2), d_v(kv_elems * 2);
  {
    const std::vector<uint16_t> nan_halves(kv_elems, 0x7E00);
    d_k.upload(nan_halves.data(), kv_elems * 2);
    d_v.upload(nan_halves.data(), kv_elems * 2);
  }
  const LayerKv kv{d_k.as<__half>(), d_v.as<__half>(), num_blocks, HK, D};
  auto slot_of = [&](int s, int p) {
    return table[static_cast<size_t>(s) * max_blocks + p / kKvBlockTokens] * kKvBlockTokens + p % kKvBlockTokens;
  };

  // Step 1 ("earlier steps"): every position before q_pos0, one rope_write_kv.
  {
    std::vector<float> rows;
    std::vector<int32_t> pos, slots;
    for (int s = 0; s < S; ++s)
      for (int p = 0; p < c.seqs[s].q_pos0; ++p) {
        const float* r = data[s].data() + static_cast<size_t>(p) * width;
        rows.insert(rows.end(), r, r + width);
        rows.insert(rows.end(), ld - width, 0.0f);
        pos.push_back(p);
        slots.push_back(slot_of(s, p));
      }
    if (!pos.empty()) {
      DeviceBuffer d_rows = upload_vec(rows), d_pos = upload_vec(pos), d_slots = upload_vec(slots);
      rope_write_kv(d_rows.as<float>(), ld, static_cast<int>(pos.size()), H, d_pos.as<int32_t>(),
                    d_slots.as<int32_t>(), rope, kv, nullptr);
      LLMD_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }

  // Step 2 (this step): the new rows in q_start order, then attention over everything.
  std::vector<float> qkv(static_cast<size_t>(total_rows) * ld, 0.0f);
  std::vector<int32_t> pos, slots, q_start(S + 1, 0), q_pos0(S);
  for (int s = 0; s < S; ++s) {
    q_pos0[s] = c.seqs[s].q_pos0;
    q_start[s + 1] = q_start[s] + c.seqs[s].rows;
    for (int i = 0; i < c.seqs[s].rows; ++i) {
      const int p = c.seqs[s].q_pos0 + i;
      std::memcpy(&qkv[static_cast<size_t>(q_start[s] + i) * ld], data[s].data() + static_cast<size_t>(p) * width,
                  width * sizeof(float));
      pos.push_back(p);
      slots.push_back(slot_of(s, p));
    }
  }
  DeviceBuffer d_qkv = upload_vec(qkv), d_pos = upload_vec(pos), d_slots = upload_vec(slots);
  DeviceBuffer d_qstart = upload_vec(q_start), d_qpos0 = upload_vec(q_pos0), d_table = upload_vec(table);
  AttentionBatch batch;
  batch.num_seqs = S;
  batch.total_q_rows = total_rows;
  batch.max_q_rows = max_rows;
  batch.max_blocks_per_seq = max_blocks;
  batch.q_start = d_qstart.as<int32_t>();
  batch.q_pos0 = d_qpos0.as<int32_t>();
  batch.block_table = d_table.as<int32_t>();

  const size_t ws_bytes = attention_workspace_bytes(batch, H, D);
  DeviceBuffer d_ws(std::max<size_t>(ws_bytes, 16));
  {
    const std::vector<float> nan_ws(d_ws.bytes() / 4, NAN);
    d_ws.upload(nan_ws.data(), nan_ws.size() * 4);
  }
  const std::vector<float> nan_out(static_cast<size_t>(total_rows) * ld_out, NAN);
  DeviceBuffer d_out = upload_vec(nan_out);
  const char* path = attention_path(batch, D);
  std::printf("    %s: %d seqs, %d rows, max_q_rows %d, max_blocks %d, path %s, workspace %zu bytes\n", c.name, S,
              total_rows, max_rows, max_blocks, path, ws_bytes);
  if (c.expect_path != nullptr) LLMD_EXPECT(std::strcmp(path, c.expect_path) == 0, "path " << path);

  if (!c.graph) {
    rope_write_kv(d_qkv.as<float>(), ld, total_rows, H, d_pos.as<int32_t>(), d_slots.as<int32_t>(), rope, kv,
                  nullptr);
    paged_attention(d_qkv.as<float>(), ld, batch, kv, H, scale, d_out.as<float>(), ld_out, d_ws.get(), ws_bytes,
                    nullptr);
    LLMD_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    // Capture-time contents: a different, shorter state (positions 0.., slots of block 0 rows).
    std::vector<int32_t> zeros(S, 0), early_pos(pos.size()), early_slots(slots.size());
    for (size_t i = 0; i < pos.size(); ++i) {
      early_pos[i] = static_cast<int32_t>(i % kKvBlockTokens);
      early_slots[i] = table[0] * kKvBlockTokens + static_cast<int32_t>(i % kKvBlockTokens);
    }
    d_qpos0.upload(zeros.data(), zeros.size() * 4);
    d_pos.upload(early_pos.data(), early_pos.size() * 4);
    d_slots.upload(early_slots.data(), early_slots.size() * 4);
    GraphRun g;
    LLMD_CUDA_CHECK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
    rope_write_kv(d_qkv.as<float>(), ld, total_rows, H, d_pos.as<int32_t>(), d_slots.as<int32_t>(), rope, kv,
                  g.stream);
    paged_attention(d_qkv.as<float>(), ld, batch, kv, H, scale, d_out.as<float>(), ld_out, d_ws.get(), ws_bytes,
                    g.stream);
    LLMD_CUDA_CHECK(cudaStreamEndCapture(g.stream, &g.graph));
    LLMD_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
    d_qpos0.upload(q_pos0.data(), q_pos0.size() * 4);
    d_pos.upload(pos.data(), pos.size() * 4);
    d_slots.upload(slots.data(), slots.size() * 4);
    // The uploads ran on the legacy stream and a pageable copy may still be in flight when
    // cudaMemcpy returns; the graph's stream does not wait for the legacy stream.
    LLMD_CUDA_CHECK(cudaDeviceSynchronize());
    LLMD_CUDA_CHECK(cudaGraphLaunch(g.exec, g.stream));
    LLMD_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  }

  // Reference, in double: rotated k of every position, rotated q of this step's rows (rq[s] row
  // i is position q_pos0 + i).
  std::vector<std::vector<double>> rq(S), rk(S);
  for (int s = 0; s < S; ++s) {
    rq[s].resize(static_cast<size_t>(c.seqs[s].rows) * H * D);
    rk[s].resize(static_cast<size_t>(len[s]) * HK * D);
    for (int p = 0; p < len[s]; ++p) {
      const float* r = data[s].data() + static_cast<size_t>(p) * width;
      for (int i = 0; i < HK * D; ++i) rk[s][static_cast<size_t>(p) * HK * D + i] = r[H * D + i];
      for (int h = 0; h < HK; ++h)
        ref_rope(&rk[s][(static_cast<size_t>(p) * HK + h) * D], p, inv_freq, c.rope_dims, c.interleaved);
      if (p < c.seqs[s].q_pos0) continue;
      double* qrow = &rq[s][static_cast<size_t>(p - c.seqs[s].q_pos0) * H * D];
      for (int i = 0; i < H * D; ++i) qrow[i] = r[i];
      for (int h = 0; h < H; ++h) ref_rope(qrow + static_cast<size_t>(h) * D, p, inv_freq, c.rope_dims, c.interleaved);
    }
  }

  // 1. This step's q and k rotated in place, v untouched.
  {
    const std::vector<float> got = download<float>(d_qkv, qkv.size());
    std::vector<double> g, r;
    std::vector<int> where_row, where_col;
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < c.seqs[s].rows; ++i) {
        const int row = q_start[s] + i, p = c.seqs[s].q_pos0 + i;
        for (int col = 0; col < width; ++col) {
          g.push_back(got[static_cast<size_t>(row) * ld + col]);
          if (col < H * D) r.push_back(rq[s][static_cast<size_t>(i) * H * D + col]);
          else if (col < (H + HK) * D) r.push_back(rk[s][static_cast<size_t>(p) * HK * D + col - H * D]);
          else r.push_back(data[s][static_cast<size_t>(p) * width + col]);
          where_row.push_back(row);
          where_col.push_back(col);
        }
      }
    check_close("q|k|v rotated in place", g, r, 1e-5, [&](size_t i) {
      return "row " + std::to_string(where_row[i]) + " col " + std::to_string(where_col[i]) + " (q heads end at " +
             std::to_string(H * D) + ", k at " + std::to_string((H + HK) * D) + ")";
    });
  }
  // 2. The KV cache, both steps' writes, read back from float16.
  {
    const std::vector<uint16_t> hk = download<uint16_t>(d_k, kv_elems), hv = download<uint16_t>(d_v, kv_elems);
    std::vector<double> gk, rkv, gv, rv;
    std::vector<int> w_seq, w_pos, w_head, w_dim;
    for (int s = 0; s < S; ++s)
      for (int p = 0; p < len[s]; ++p) {
        const int slot = slot_of(s, p);
        for (int h = 0; h < HK; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t at =
                ((static_cast<size_t>(slot / kKvBlockTokens) * HK + h) * kKvBlockTokens + slot % kKvBlockTokens) * D + d;
            gk.push_back(half_to_float(hk[at]));
            rkv.push_back(rk[s][(static_cast<size_t>(p) * HK + h) * D + d]);
            gv.push_back(half_to_float(hv[at]));
            rv.push_back(data[s][static_cast<size_t>(p) * width + (H + HK) * D + h * D + d]);
            w_seq.push_back(s);
            w_pos.push_back(p);
            w_head.push_back(h);
            w_dim.push_back(d);
          }
      }
    auto where = [&](size_t i) {
      return "seq " + std::to_string(w_seq[i]) + " pos " + std::to_string(w_pos[i]) + " kv head " +
             std::to_string(w_head[i]) + " dim " + std::to_string(w_dim[i]);
    };
    check_close("K cache (rotated, f16)", gk, rkv, 2e-3, where);
    check_close("V cache (f16)", gv, rv, 2e-3, where);
  }
  // 3. The attention output, every element of every row; the padding columns stay NaN.
  {
    const std::vector<float> got = download<float>(d_out, nan_out.size());
    const int group = H / HK;
    std::vector<double> g, r;
    std::vector<int> w_seq, w_row, w_head, w_dim;
    std::vector<double> sc;
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < c.seqs[s].rows; ++i) {
        const int row = q_start[s] + i, qp = c.seqs[s].q_pos0 + i;
        for (int col = H * D; col < ld_out; ++col)
          LLMD_EXPECT(std::isnan(got[static_cast<size_t>(row) * ld_out + col]),
                      "out row " << row << " padding column " << col << " was written");
        for (int h = 0; h < H; ++h) {
          const int kh = h / group;
          const double* qv = &rq[s][(static_cast<size_t>(i) * H + h) * D];
          sc.assign(qp + 1, 0.0);
          double mx = -1e300;
          for (int p = 0; p <= qp; ++p) {
            const double* kvec = &rk[s][(static_cast<size_t>(p) * HK + kh) * D];
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += qv[d] * kvec[d];
            sc[p] = dot * scale;
            mx = std::max(mx, sc[p]);
          }
          double sum = 0;
          for (int p = 0; p <= qp; ++p) sum += (sc[p] = std::exp(sc[p] - mx));
          std::vector<double> o(D, 0.0);
          for (int p = 0; p <= qp; ++p) {
            const float* vv = data[s].data() + static_cast<size_t>(p) * width + (H + HK) * D + kh * D;
            for (int d = 0; d < D; ++d) o[d] += sc[p] * vv[d];
          }
          for (int d = 0; d < D; ++d) {
            g.push_back(got[static_cast<size_t>(row) * ld_out + h * D + d]);
            r.push_back(o[d] / sum);
            w_seq.push_back(s);
            w_row.push_back(i);
            w_head.push_back(h);
            w_dim.push_back(d);
          }
        }
      }
    // Per-sequence errors first: which sequence (decode row, chunk, long context) went wrong.
    size_t at = 0;
    for (int s = 0; s < S; ++s) {
      const size_t n = static_cast<size_t>(c.seqs[s].rows) * H * D;
      std::vector<float> gs(g.begin() + at, g.begin() + at + n), rs(r.begin() + at, r.begin() + at + n);
      std::printf("      seq %d (q_pos0 %d, %d rows, %d positions): rel err %.3e\n", s, c.seqs[s].q_pos0,
                  c.seqs[s].rows, len[s], testing::relative_error(gs.data(), rs.data(), n));
      at += n;
    }
    check_close("attention output", g, r, 5e-3, [&](size_t i) {
      return "seq " + std::to_string(w_seq[i]) + " row " + std::to_string(w_row[i]) + " (position " +
             std::to_string(c.seqs[w_seq[i]].q_pos0 + w_row[i]) + ") head " + std::to_string(w_head[i]) + " dim " +
             std::to_string(w_dim[i]);
    });
  }
}

// Test model shapes: head_dim 64, 9 heads over 3 KV heads.
LLMD_CUDA_TEST(attention_d64_gqa9x3_mixed) {
  // A chunk from 0, one starting mid-block, decode rows at 64 and 65 positions and at 4991, and a
  // block-aligned chunk: one mixed step.
  run_case({"d64 9/3 mixed", 9, 3, 64, 64, true, 10000.0,
            {{0, 100}, {37, 70}, {63, 1}, {64, 1}, {4990, 1}, {128, 64}}, 0, "prefill_flash_mma"});
}
LLMD_CUDA_TEST(attention_d64_gqa9x3_decode) {
  run_case({"d64 9/3 decode", 9, 3, 64, 64, true, 10000.0, {{0, 1}, {63, 1}, {64, 1}, {4999, 1}, {200, 1}}, 5,
            "decode_split"});
}
LLMD_CUDA_TEST(attention_d64_prefill_600_neox) {
  run_case({"d64 9/3 prefill 600", 9, 3, 64, 64, false, 10000.0, {{0, 600}}, 0, "prefill_flash_mma"});
}
// Llama-3-8B shapes: head_dim 128, 32 heads over 8 KV heads; NeoX pairs with partial rotary.
LLMD_CUDA_TEST(attention_d128_gqa32x8_mixed_partial_neox) {
  run_case({"d128 32/8 mixed, rope 64 of 128 neox", 32, 8, 128, 64, false, 500000.0,
            {{1000, 200}, {4999, 1}, {64, 1}, {0, 1}, {0, 70}}, 2, "prefill_flash_mma"});
}
LLMD_CUDA_TEST(attention_d128_gqa32x8_decode) {
  run_case({"d128 32/8 decode", 32, 8, 128, 128, true, 500000.0, {{4999, 1}, {511, 1}, {0, 1}, {64, 1}, {1234, 1}}, 3,
            "decode_split"});
}
LLMD_CUDA_TEST(attention_d128_gqa32x8_decode_single_split) {
  // Enough sequences that each gets one split: the decode kernel normalizes and writes directly.
  std::vector<SeqSpec> seqs;
  std::uniform_int_distribution<int> p(0, 300);
  for (int i = 0; i < 40; ++i) seqs.push_back({p(rng()), 1});
  run_case({"d128 32/8 decode x40", 32, 8, 128, 128, true, 500000.0, seqs, 0, "decode_split"});
}
LLMD_CUDA_TEST(attention_d128_mha8x8) {
  run_case({"d128 8/8 mixed", 8, 8, 128, 128, true, 10000.0, {{0, 130}, {70, 1}, {300, 65}}, 0, "prefill_flash_mma"});
  run_case({"d128 8/8 decode", 8, 8, 128, 128, true, 10000.0, {{70, 1}, {5000, 1}}, 1, "decode_split"});
}
LLMD_CUDA_TEST(attention_d64_gqa16x1_chunks) {
  // 16 query heads per KV head: the decode kernel takes them in two chunks of 8.
  run_case({"d64 16/1 decode", 16, 1, 64, 32, false, 10000.0, {{3000, 1}, {10, 1}}, 0, "decode_split"});
  run_case({"d64 16/1 mixed", 16, 1, 64, 32, false, 10000.0, {{50, 80}, {3000, 1}}, 0, "prefill_flash_mma"});
}
LLMD_CUDA_TEST(attention_decode_graph_replay) {
  AttnCase a{"d128 32/8 decode, graph", 32, 8, 128, 128, true, 500000.0, {{4999, 1}, {100, 1}, {64, 1}}, 4,
             "decode_split"};
  a.graph = true;
  run_case(a);
  AttnCase b{"d64 9/3 decode, graph", 9, 3, 64, 64, false, 10000.0, {{700, 1}, {3, 1}}, 0, "decode_split"};
  b.graph = true;
  run_case(b);
}
LLMD_CUDA_TEST(attention_generic_head_dims) {
  run_case({"d80 4/2 mixed", 4, 2, 80, 80, false, 10000.0, {{0, 70}, {100, 1}}, 0, "prefill_generic"});
  run_case({"d80 4/2 decode", 4, 2, 80, 80, false, 10000.0, {{700, 1}, {64, 1}}, 0, "decode_generic"});
  run_case({"d96 6/2 partial 32", 6, 2, 96, 32, true, 10000.0, {{5, 40}, {129, 1}}, 1, "prefill_generic"});
  run_case({"d256 4/4 mixed", 4, 4, 256, 256, false, 1000000.0, {{10, 20}, {300, 1}}, 0, "prefill_generic"});
}

}  // namespace
}  // namespace llmd::cuda
