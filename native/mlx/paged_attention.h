// MLX custom primitive for one layer's attention over the block KV pool:
// rotary embedding of q and k, append of k/v at each token's position in its own sequence,
// then causal softmax attention of each query over its sequence's positions.
//
// Why a primitive and not MLX ops: a step mixes decode tokens and prefill chunks of many
// sequences at different positions; each needs its own KV length and causal range. Doing it
// here keeps the whole step one MLX graph with per-sequence attention (no padding), and the
// KV lives in blocks the prefix cache can share.
#pragma once

#include <memory>
#include <vector>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "../core/kv_cache.h"
#include "../core/step.h"
#include "attention_path_counts.h"
#include "rope.h"

namespace llmd {

namespace mx = mlx::core;

struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.f;
};

// Row layout of one step, shared by every layer's attention primitive.
struct AttentionBatch {
  struct Segment {
    SequenceKv* kv;
    int row0;       // first row of this segment in the step's activations
    int n_rows;
    int start_pos;  // position of row0
    // Per row, the position up to which (exclusive) it attends when past itself, else 0;
    // empty: causal (StepSegment::attend_to). Both backends honour it.
    std::vector<int> attend_to = {};
  };
  std::vector<Segment> segments;
  KvPool* pool = nullptr;
  // Sliding-window layers: a query at position p sees positions p - window + 1 .. p (as
  // transformers' and llama.cpp's masks do); 0 sees every earlier position.
  int window = 0;
  // RoPE cos/sin per row ([rows][dims / 2]), computed once per step for all layers.
  std::vector<float> rope_cos;
  std::vector<float> rope_sin;

  void build_rope_tables(const Rope& rope);
  // Where the CPU kernels count their tiles and span tasks (the model's, reported in its
  // attention_paths); null: not counted.
  AttentionPathCounts* counts = nullptr;
};

class PagedAttention : public mx::UnaryPrimitive {
 public:
  PagedAttention(mx::Stream stream, std::shared_ptr<const AttentionBatch> batch, int layer,
                 AttentionShape shape, std::shared_ptr<const Rope> rope, bool write_kv)
      : mx::UnaryPrimitive(stream), batch_(std::move(batch)), layer_(layer), shape_(shape),
        rope_(std::move(rope)), write_kv_(write_kv) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "LlmdPagedAttention"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  std::shared_ptr<const AttentionBatch> batch_;
  int layer_;
  AttentionShape shape_;
  std::shared_ptr<const Rope> rope_;
  bool write_kv_;
};

// qkv: [rows, (n_heads + 2 * n_kv_heads) * head_dim] float32 -> [rows, n_heads * head_dim].
// `layer` is the KV layer written and read; its KvShape entry must match `shape`. With
// `write_kv` false (a layer sharing an earlier layer's KV, Gemma 4), qkv holds only the
// queries, [rows, n_heads * head_dim], and `layer`'s KV (written by this step's earlier layer)
// is only read.
mx::array paged_attention(const mx::array& qkv, std::shared_ptr<const AttentionBatch> batch,
                          int layer, AttentionShape shape, std::shared_ptr<const Rope> rope,
                          bool write_kv = true);

}  // namespace llmd
