#include "paged_attention.h"

#include <mlx/backend/cpu/encoder.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "../core/thread_pool.h"

namespace llmd {

mx::array paged_attention(const mx::array& qkv, std::shared_ptr<const AttentionBatch> batch,
                          int layer, AttentionShape shape, std::shared_ptr<const Rope> rope) {
  const int width = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim;
  if (qkv.ndim() != 2 || qkv.shape(1) != width) {
    throw std::invalid_argument("paged_attention: qkv must be [rows, " + std::to_string(width) + "]");
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  auto in = mx::contiguous(qkv, false, stream);
  return mx::array({qkv.shape(0), shape.n_heads * shape.head_dim}, mx::float32,
                   std::make_shared<PagedAttention>(stream, std::move(batch), layer, shape, std::move(rope)),
                   {in});
}

std::vector<mx::Shape> PagedAttention::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0), shape_.n_heads * shape_.head_dim}};
}

void PagedAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("LlmdPagedAttention has no GPU kernel in this build");
}

namespace {

// Rows of one segment with their positions, flattened so tasks can be split evenly.
struct RowRef {
  const AttentionBatch::Segment* seg;
  int row;
  int pos;
};

inline float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void PagedAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const mx::array& qkv = inputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(qkv);
  encoder.set_output_array(out);
  encoder.dispatch([qkv, out, batch = batch_, layer = layer_, shape = shape_, rope = rope_]() mutable {
    const int hd = shape.head_dim;
    const int H = shape.n_heads;
    const int G = shape.n_kv_heads;
    const int group = H / G;
    const int width = (H + 2 * G) * hd;
    const float* in = qkv.data<float>();
    float* o = out.data<float>();
    KvPool& pool = *batch->pool;
    constexpr int BT = KvPool::kBlockTokens;

    std::vector<RowRef> rows;
    for (const auto& seg : batch->segments) {
      for (int i = 0; i < seg.n_rows; ++i) rows.push_back({&seg, seg.row0 + i, seg.start_pos + i});
    }
    auto& threads = ThreadPool::global();

    // Phase 1: rotate and append this step's keys and values.
    threads.parallel_for(static_cast<int>(rows.size()), [&](int r0, int r1) {
      for (int i = r0; i < r1; ++i) {
        const RowRef& r = rows[i];
        const float* src = in + static_cast<size_t>(r.row) * width;
        const int block = r.seg->kv->blocks()[r.pos / BT];
        const int off = r.pos % BT;
        for (int g = 0; g < G; ++g) {
          float* k = pool.keys(block, layer, g) + off * hd;
          float* v = pool.values(block, layer, g) + off * hd;
          std::memcpy(k, src + (H + g) * hd, hd * sizeof(float));
          std::memcpy(v, src + (H + G + g) * hd, hd * sizeof(float));
          rope->apply(k, r.pos);
        }
      }
    });

    // Phase 2: each (row, head) attends over positions [0, pos] of its own sequence.
    const int tasks = static_cast<int>(rows.size()) * H;
    threads.parallel_for(tasks, [&](int t0, int t1) {
      std::vector<float> scores;
      std::vector<float> q(hd);
      std::vector<float> acc(hd);
      for (int t = t0; t < t1; ++t) {
        const RowRef& r = rows[t / H];
        const int h = t % H;
        const int g = h / group;
        std::memcpy(q.data(), in + static_cast<size_t>(r.row) * width + h * hd, hd * sizeof(float));
        rope->apply(q.data(), r.pos);
        const int n = r.pos + 1;
        scores.resize(n);
        const auto& blocks = r.seg->kv->blocks();
        float mx_score = -INFINITY;
        for (int j = 0; j < n; ++j) {
          const float* k = pool.keys(blocks[j / BT], layer, g) + (j % BT) * hd;
          scores[j] = dot(q.data(), k, hd) * shape.scale;
          mx_score = std::max(mx_score, scores[j]);
        }
        float denom = 0.f;
        for (int j = 0; j < n; ++j) {
          scores[j] = std::exp(scores[j] - mx_score);
          denom += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int j = 0; j < n; ++j) {
          const float* v = pool.values(blocks[j / BT], layer, g) + (j % BT) * hd;
          const float w = scores[j];
          for (int d = 0; d < hd; ++d) acc[d] += w * v[d];
        }
        float* dst = o + static_cast<size_t>(r.row) * H * hd + h * hd;
        const float inv = 1.f / denom;
        for (int d = 0; d < hd; ++d) dst[d] = acc[d] * inv;
      }
    });
  });
}

}  // namespace llmd
