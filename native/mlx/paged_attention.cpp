#include "paged_attention.h"

#include <mlx/backend/cpu/encoder.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "../core/hadamard.h"
#include "../core/kv_quant.h"
#include "../core/op_profile.h"
#include "../core/scratch.h"
#include "../core/thread_pool.h"
#include "attention_kernels.h"
#include "row_major.h"

namespace llmd {

mx::array paged_attention(const mx::array& qkv, std::shared_ptr<const AttentionBatch> batch,
                          int layer, AttentionShape shape, std::shared_ptr<const Rope> rope,
                          bool write_kv) {
  const int width = (shape.n_heads + (write_kv ? 2 * shape.n_kv_heads : 0)) * shape.head_dim;
  if (shape.head_dim % 16 != 0) {
    throw std::invalid_argument("paged_attention: head_dim must be a multiple of 16");
  }
  const KvShape& kv = batch->pool->shape();
  if (kv.kv_heads_of(layer) != shape.n_kv_heads || kv.head_dim_of(layer) != shape.head_dim) {
    throw std::invalid_argument("paged_attention: layer " + std::to_string(layer) +
                                "'s KV shape in the pool differs from the attention's");
  }
  if (qkv.ndim() != 2 || qkv.shape(1) != width) {
    throw std::invalid_argument("paged_attention: qkv must be [rows, " + std::to_string(width) + "]");
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  mx::array in = float32_input(qkv, stream);
  return mx::array({qkv.shape(0), shape.n_heads * shape.head_dim}, mx::float32,
                   std::make_shared<PagedAttention>(stream, std::move(batch), layer, shape, std::move(rope), write_kv),
                   {in});
}

std::vector<mx::Shape> PagedAttention::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0), shape_.n_heads * shape_.head_dim}};
}

void PagedAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("LlmdPagedAttention has no GPU kernel in this build");
}

void AttentionBatch::build_rope_tables(const Rope& rope) {
  const int half = rope.dims / 2;
  int rows = 0;
  for (const auto& seg : segments) rows += seg.n_rows;
  rope_cos.resize(static_cast<size_t>(rows) * half);
  rope_sin.resize(static_cast<size_t>(rows) * half);
  for (const auto& seg : segments) {
    for (int i = 0; i < seg.n_rows; ++i) {
      const size_t off = static_cast<size_t>(seg.row0 + i) * half;
      rope.tables(seg.start_pos + i, rope_cos.data() + off, rope_sin.data() + off);
    }
  }
}

namespace {

// Tiles per thread below which PagedAttention splits tiles into span tasks (attention_kernels.h):
// with fewer, a thread that drew a long tile works on while the others wait (one sequence of a
// model with 3 KV heads on 2 threads: one thread idle for half of the attention).
constexpr int kSpanTasksBelowTilesPerThread = 4;

// A tile: rows row0 .. row0 + n_rows - 1 of one segment x heads head0 .. head0 + n_heads - 1
// of one KV group (n_rows * n_heads <= kMaxTileRows).
struct TileRef {
  const AttentionBatch::Segment* seg;
  int row0;
  int n_rows;
  int head0;
  int n_heads;
};

}  // namespace

void PagedAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const mx::array& qkv = inputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(qkv);
  encoder.set_output_array(out);
  encoder.dispatch([qkv, out, batch = batch_, layer = layer_, shape = shape_, rope = rope_,
                    write_kv = write_kv_]() mutable {
    ScopedOpTimer timer(OpKind::Attention);
    const int hd = shape.head_dim;
    const int H = shape.n_heads;
    const int G = shape.n_kv_heads;
    const int group = H / G;
    const int width = (H + (write_kv ? 2 * G : 0)) * hd;
    const int half = rope->dims / 2;
    const int rows = qkv.shape(0);
    const RowMajor qkv_rows(qkv);
    const float* in = qkv_rows.data();
    float* o = out.data<float>();
    KvPool& pool = *batch->pool;
    constexpr int BT = KvPool::kBlockTokens;
    auto& threads = ThreadPool::global();

    const KvType kv_type = pool.shape().type;
    const AttentionKernels& kernels = attention_kernels();
    // Quantized KV holds Hadamard-rotated keys and values (hadamard.h): queries are rotated as
    // the keys are, and each output rotated back after attention.
    const bool rotated = kv_type_quantized(kv_type);
    const int k_rot = hadamard::key_block(hd), v_rot = hadamard::value_block(hd);

    // Phase 1: rotate keys into the (transposed) KV blocks, values as they are (unless the
    // layer only reads another's KV), converted to the pool's element type (q8_0 / q4_0: per
    // 32-number block of one position, kv_quant.h); rotate and pre-scale queries into a
    // scratch copy (quantized KV: keys, values and queries Hadamard-rotated first).
    thread_local std::vector<float> queries;
    grow_scratch(queries, static_cast<size_t>(rows) * H * hd);
    std::vector<std::pair<const AttentionBatch::Segment*, int>> row_seg(rows);
    for (const auto& seg : batch->segments) {
      for (int i = 0; i < seg.n_rows; ++i) row_seg[seg.row0 + i] = {&seg, seg.start_pos + i};
    }
    float* qs = queries.data();
    threads.parallel_for(rows, [&](int r0, int r1) {
      std::vector<float> k(hd), v_rotated(rotated ? hd : 0);
      std::vector<uint16_t> k_half(hd);
      for (int row = r0; row < r1; ++row) {
        const auto [seg, pos] = row_seg[row];
        const float* src = in + static_cast<size_t>(row) * width;
        const float* ct = batch->rope_cos.data() + static_cast<size_t>(row) * half;
        const float* st = batch->rope_sin.data() + static_cast<size_t>(row) * half;
        const int block = seg->kv->blocks()[pos / BT];
        const int off = pos % BT;
        for (int g = 0; g < (write_kv ? G : 0); ++g) {
          std::memcpy(k.data(), src + (H + g) * hd, hd * sizeof(float));
          rope->rotate(k.data(), ct, st);
          const float* v = src + (H + G + g) * hd;
          if (rotated) {
            hadamard::rotate(k.data(), hd, k_rot);
            std::memcpy(v_rotated.data(), v, hd * sizeof(float));
            hadamard::rotate(v_rotated.data(), hd, v_rot);
            v = v_rotated.data();
          }
          if (kv_type_quantized(kv_type)) {
            kv_quant::write_key(kv_type, pool.keys(block, layer, g), off, k.data(), hd, BT);
            kv_quant::write_value(kv_type, pool.values(block, layer, g), off, v, hd, BT);
          } else if (kv_type == KvType::F16) {
            auto* kt = static_cast<uint16_t*>(pool.keys(block, layer, g));
            kernels.floats_to_halves(k.data(), k_half.data(), hd);
            for (int d = 0; d < hd; ++d) kt[static_cast<size_t>(d) * BT + off] = k_half[d];
            kernels.floats_to_halves(v, static_cast<uint16_t*>(pool.values(block, layer, g)) +
                                            static_cast<size_t>(off) * hd, hd);
          } else {
            auto* kt = static_cast<float*>(pool.keys(block, layer, g));
            for (int d = 0; d < hd; ++d) kt[static_cast<size_t>(d) * BT + off] = k[d];
            std::memcpy(static_cast<float*>(pool.values(block, layer, g)) + static_cast<size_t>(off) * hd, v,
                        hd * sizeof(float));
          }
        }
        for (int h = 0; h < H; ++h) {
          float* q = qs + (static_cast<size_t>(row) * H + h) * hd;
          std::memcpy(q, src + h * hd, hd * sizeof(float));
          rope->rotate(q, ct, st);
          for (int d = 0; d < hd; ++d) q[d] *= shape.scale;
          if (rotated) hadamard::rotate(q, hd, k_rot);
        }
      }
    });

    // Phase 2: one task per tile of up to kMaxTileRows query vectors that read the same KV
    // blocks: the heads of one KV group for a run of consecutive rows of one sequence, so each
    // KV tile the kernel loads serves them all while it is in cache (decode: one row, the
    // group's heads read the group's keys and values once for all of them). A query's result
    // does not depend on its tile (attention_impl.h), so the split is free to follow the load.
    std::vector<TileRef> tiles;
    const int heads_per_tile = std::min(group, kMaxTileRows);
    const int rows_per_tile = std::max(1, kMaxTileRows / heads_per_tile);
    for (const auto& seg : batch->segments) {
      for (int i = 0; i < seg.n_rows; i += rows_per_tile) {
        for (int h = 0; h < H; h += heads_per_tile) {
          tiles.push_back({&seg, seg.row0 + i, std::min(rows_per_tile, seg.n_rows - i), h,
                           std::min({group - h % group, heads_per_tile, H - h})});
        }
      }
    }
    const AttendTileFn attend = kernels.attend(kv_type);
    auto make_tile = [&](const TileRef& tile) {
      AttentionTile at;
      at.rows = tile.n_rows * tile.n_heads;
      for (int q = 0; q < at.rows; ++q) {
        const int row = tile.row0 + q / tile.n_heads;
        const int h = tile.head0 + q % tile.n_heads;
        at.q[q] = qs + (static_cast<size_t>(row) * H + h) * hd;
        const int pos = row_seg[row].second;
        at.n_pos[q] = pos + 1;
        // A row that sees past itself (an image's rows see the whole image, all written in
        // phase 1 above); its window still starts from its own position, as transformers'
        // OR(causal, image block) AND sliding-window mask.
        const auto& see = tile.seg->attend_to;
        if (!see.empty()) {
          const int i = row - tile.seg->row0;
          at.n_pos[q] = std::min(std::max(pos + 1, see[i]), tile.seg->start_pos + tile.seg->n_rows);
        }
        at.first_pos[q] = batch->window > 0 ? std::max(0, pos + 1 - batch->window) : 0;
        at.out[q] = o + static_cast<size_t>(row) * H * hd + h * hd;
      }
      return at;
    };
    // Runs the kernel over the blocks the tile's queries read (those wholly before every
    // query's window are never read: their window part may be gone, kv_cache.h).
    auto run_tile = [&](const TileRef& tile, const AttentionTile& at, AttentionTileScratch& scratch) {
      int n_max = 0, first = at.n_pos[0];
      for (int q = 0; q < at.rows; ++q) {
        n_max = std::max(n_max, at.n_pos[q]);
        first = std::min(first, at.first_pos[q]);
      }
      const int nb = (n_max + BT - 1) / BT;
      const int g = tile.head0 / group;
      const auto& blocks = tile.seg->kv->blocks();
      scratch.k_blocks.assign(nb, nullptr);
      scratch.v_blocks.assign(nb, nullptr);
      for (int b = first / BT; b < nb; ++b) {
        scratch.k_blocks[b] = pool.keys(blocks[b], layer, g);
        scratch.v_blocks[b] = pool.values(blocks[b], layer, g);
      }
      attend(at, scratch.k_blocks.data(), scratch.v_blocks.data(), hd, BT, scratch.floats.data());
    };
    // Span tasks: when the tiles alone are too few to keep every thread busy (decode of a few
    // sequences: one tile per KV group and sequence), a tile whose queries read more than one
    // span (kKvSpan) becomes one task per span, each writing its span's partial result; the
    // partials are folded in span order afterwards, with the bits of one sweep (attention_kernels.h).
    struct Task {
      int tile;
      int span;     // -1: the whole tile
      size_t part;  // a span task's partials (span_part_floats)
    };
    struct SplitTile {
      int tile;
      int spans;
      size_t part;  // its first span's partials; the others follow
    };
    std::vector<Task> tasks;
    std::vector<SplitTile> split;
    const bool may_split = static_cast<int>(tiles.size()) < kSpanTasksBelowTilesPerThread * threads.size();
    size_t part_floats = 0;
    for (int i = static_cast<int>(tiles.size()) - 1; i >= 0; --i) {  // latest (costliest) tiles first
      const auto [first_span, last_span] = may_split ? tile_spans(make_tile(tiles[i])) : std::pair{0, 0};
      if (last_span <= first_span) {
        tasks.push_back({i, -1, 0});
        continue;
      }
      split.push_back({i, last_span - first_span + 1, part_floats});
      for (int sp = first_span; sp <= last_span; ++sp) {
        tasks.push_back({i, sp, part_floats});
        part_floats += span_part_floats(tiles[i].n_rows * tiles[i].n_heads, hd);
      }
    }
    thread_local std::vector<float> partials;
    float* parts = grow_scratch(partials, part_floats);
    threads.parallel_for_dynamic(static_cast<int>(tasks.size()), [&](int t0, int t1) {
      AttentionTileScratch& scratch = attention_tile_scratch(hd);
      for (int i = t0; i < t1; ++i) {
        const Task& task = tasks[i];
        const TileRef& tile = tiles[task.tile];
        const AttentionTile at = make_tile(tile);
        if (task.span >= 0) {
          run_tile(tile, span_task(at, task.span, parts + task.part, hd), scratch);
          continue;
        }
        run_tile(tile, at, scratch);
        if (rotated) {
          for (int q = 0; q < at.rows; ++q) hadamard::rotate(at.out[q], hd, v_rot);
        }
      }
    });
    // Each split tile's queries: their spans folded in order, then rotated back.
    threads.parallel_for(static_cast<int>(split.size()), [&](int s0, int s1) {
      for (int i = s0; i < s1; ++i) {
        const AttentionTile at = make_tile(tiles[split[i].tile]);
        fold_span_tasks(kernels, at, parts + split[i].part, split[i].spans, hd);
        if (rotated) {
          for (int q = 0; q < at.rows; ++q) hadamard::rotate(at.out[q], hd, v_rot);
        }
      }
    });
    if (AttentionPathCounts* counts = batch->counts) {
      counts->cpu_tiles += tiles.size();
      counts->cpu_span_tasks += tasks.size() - (tiles.size() - split.size());
    }
  });
}

}  // namespace llmd
