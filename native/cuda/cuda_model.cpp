// See cuda_model.h. One step: the token embeddings are gathered, each layer runs norm+quantize,
// the q|k|v product, RoPE + KV write, paged attention, the output product added into the
// residual stream, norm+quantize, gate|up with SwiGLU, the down product added into the residual;
// the rows that return logits are picked, normed and multiplied by the output matrix, and their
// logits come back to the host for the engine's sampler. A decode step (one token per sequence)
// is the same sequence of launches every time for a given number of sequences, so it is
// captured once per count as a CUDA graph and replayed: a step is then one graph launch plus
// the copies of its token tables and logits.
#include "cuda_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../core/dequantize.h"
#include "attention.h"
#include "cuda_check.h"
#include "device_buffer.h"
#include "matmul.h"
#include "model_kernels.h"

namespace llmd::cuda {

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver: clear the error, report "no"
    return false;
  }
  return n > 0;
}

std::string device_name() {
  cudaDeviceProp prop{};
  LLMD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

std::pair<size_t, size_t> device_memory_info() {
  size_t free_bytes = 0, total_bytes = 0;
  LLMD_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

size_t device_memory_bytes() { return device_memory_info().second; }

namespace {

// Owns a CUDA stream; the model's every launch and copy goes through it.
class Stream {
 public:
  Stream() { LLMD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Owns an instantiated CUDA graph (one captured decode step).
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraph_t graph) {
    size_t n = 0;
    LLMD_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    nodes_ = static_cast<int>(n);
    LLMD_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
    cudaGraphDestroy(graph);
  }
  ~GraphExec() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)), nodes_(o.nodes_) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    if (this != &o) {
      if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
      exec_ = std::exchange(o.exec_, nullptr);
      nodes_ = o.nodes_;
    }
    return *this;
  }
  void launch(cudaStream_t stream) const { LLMD_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }
  int nodes() const { return nodes_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
  int nodes_ = 0;
};

DeviceBuffer upload_vector(const TensorView& t) {
  std::vector<float> values(static_cast<size_t>(t.n_elements()));
  dequantize_row(t.type, t.data, values.data(), t.n_elements());
  DeviceBuffer buffer(values.size() * sizeof(float));
  buffer.upload(values.data(), buffer.bytes());
  return buffer;
}

// One product whose output may come from several GGUF tensors side by side (q|k|v, gate|up):
// stacked into one matrix when their types agree (one launch, one pass over the activations),
// else kept apart, each writing its own columns of the same output rows.
struct Product {
  std::vector<DeviceMatrix> parts;
  std::vector<int> offsets;  // first output column of each part
  int rows = 0;
  bool stacked() const { return parts.size() == 1; }
};

Product upload_product(const std::vector<const TensorView*>& tensors) {
  Product product;
  const int cols = static_cast<int>(tensors[0]->shape[0]);
  bool same_type = true;
  for (const TensorView* t : tensors) {
    if (t->shape[0] != cols) throw std::runtime_error(t->name + ": input size differs from " + tensors[0]->name);
    same_type = same_type && t->type == tensors[0]->type;
  }
  if (same_type && tensors.size() > 1) {
    std::vector<GgufPart> parts;
    for (const TensorView* t : tensors) parts.push_back({t->data, static_cast<int>(t->shape[1])});
    product.parts.push_back(upload_gguf_stacked(tensors[0]->type, parts.data(), static_cast<int>(parts.size()), cols));
    product.offsets.push_back(0);
    product.rows = product.parts.back().rows;
    return product;
  }
  for (const TensorView* t : tensors) {
    product.offsets.push_back(product.rows);
    product.parts.push_back(upload_gguf_matrix(t->type, t->data, static_cast<int>(t->shape[1]), cols));
    product.rows += product.parts.back().rows;
  }
  return product;
}

struct Layer {
  DeviceBuffer attn_norm;
  DeviceBuffer ffn_norm;
  Product qkv;
  DeviceBuffer qkv_bias;        // Qwen2 (q|k|v), else empty
  DeviceBuffer q_norm, k_norm;  // Qwen3, else empty
  DeviceMatrix wo;
  Product gate_up;  // stacked: SwiGLU in the epilogue; apart: gate and up, then swiglu_inplace
  DeviceMatrix down;
};

// Where each per-step table sits in the packed int32 staging buffer: the layout depends only on
// (rows, sequences, logit rows, block-table width), so a graph captured for a decode step of S
// sequences keeps reading the right addresses when the next step of S sequences is copied in.
struct TableLayout {
  size_t tokens, positions, slots, q_start, q_pos0, logit_rows, block_table, total;
  TableLayout(int rows, int seqs, int logit_count, int table_width) {
    tokens = 0;
    positions = tokens + rows;
    slots = positions + rows;
    q_start = slots + rows;
    q_pos0 = q_start + seqs + 1;
    logit_rows = q_pos0 + seqs;
    block_table = logit_rows + logit_count;
    total = block_table + static_cast<size_t>(seqs) * table_width;
  }
};

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strcmp(v, "0") != 0;
}

class CudaLlama final : public Model {
 public:
  CudaLlama(LlamaConfig config, ModelInfo info, std::vector<Layer> layers, DeviceBuffer out_norm, DeviceMatrix lm_head,
            DeviceMatrix embed, bool tied)
      : config_(std::move(config)),
        info_(std::move(info)),
        layers_(std::move(layers)),
        out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)),
        embed_(std::move(embed)),
        tied_(tied) {
    inv_freq_ = DeviceBuffer(config_.rope_inv_freq.size() * sizeof(float));
    inv_freq_.upload(config_.rope_inv_freq.data(), inv_freq_.bytes());
    qkv_dim_ = (config_.n_heads + 2 * config_.n_kv_heads) * config_.head_dim;
    attn_dim_ = config_.n_heads * config_.head_dim;
  }

  ~CudaLlama() override {
    // Let in-flight work finish before the buffers it reads are freed.
    cudaStreamSynchronize(stream_.get());
  }

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }

  KvShape kv_shape() const override {
    KvShape shape;
    shape.n_layers = config_.n_layers;
    shape.n_kv_heads = config_.n_kv_heads;
    shape.head_dim = config_.head_dim;
    shape.host_storage = false;  // the blocks live on the GPU (kv_ below), indexed by the pool's ids
    shape.type = KvType::F16;
    return shape;
  }

  bool supports_quantized_kv() const override { return false; }  // KV blocks are float16 (attention.h)

  std::map<std::string, std::string> matmul_paths() const override {
    std::map<std::string, std::string> paths;
    const Layer& l = layers_.front();
    auto both = [](const DeviceMatrix& m) {
      // 1 row, a full decode batch (the tensor-core kernel for quantized formats), and prefill.
      return std::string(matmul_path(m, 1)) + " | " + matmul_path(m, kMaxGemvBatch) + " | " +
             matmul_path(m, kMaxGemvBatch + 1);
    };
    paths["blk.attn_qkv"] = both(l.qkv.parts.front());
    paths["blk.attn_output"] = both(l.wo);
    paths["blk.ffn_gate_up"] = both(l.gate_up.parts.front());
    paths["blk.ffn_down"] = both(l.down);
    paths["output"] = std::string(matmul_path(lm_head_, 1)) + " | " + matmul_path(lm_head_, kMaxGemvBatch);
    return paths;
  }

  std::map<std::string, uint64_t> attention_paths() const override { return attention_calls_; }

  static int graph_key(int seqs, bool mma) { return seqs * 2 + (mma ? 1 : 0); }

  int graph_nodes(int seqs) const {
    auto it = graphs_.find(graph_key(seqs, env_flag("LLMD_CUDA_MMA", true)));
    return it == graphs_.end() ? -1 : it->second.nodes();
  }

  void copy_kv_block(KvPool& pool, int src, int dst) override {
    ensure_kv(pool);
    const size_t block_elems = static_cast<size_t>(config_.n_kv_heads) * kKvBlockTokens * config_.head_dim;
    for (int l = 0; l < config_.n_layers; ++l) {
      const LayerKv kv = layer_kv(l);
      for (__half* base : {kv.k, kv.v}) {
        LLMD_CUDA_CHECK(cudaMemcpyAsync(base + dst * block_elems, base + src * block_elems, block_elems * sizeof(__half),
                                        cudaMemcpyDeviceToDevice, stream_.get()));
      }
    }
    LLMD_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    const int seqs = static_cast<int>(step.segments.size());
    const int rows = step.total_tokens();
    const int logit_count = step.logits_rows();
    if (rows == 0) {
      logits.clear();
      return;
    }
    if (step.hidden_rows() > 0) throw std::runtime_error(info_.architecture + " (cuda) cannot output hidden states");
    ensure_kv(pool);
    ensure_capacity(rows);
    ensure_logit_rows(logit_count);

    const TableLayout layout(rows, seqs, logit_count, table_width_);
    int32_t* h = staging_.as<int32_t>();
    int row = 0, logit_row = 0, max_q_rows = 0;
    const int gemv_rows = gemv_row_limit();
    bool decode_only = seqs <= gemv_rows;
    for (int s = 0; s < seqs; ++s) {
      const StepSegment& seg = step.segments[s];
      if (!seg.embeddings.empty()) throw std::runtime_error("cuda backend: this model takes no image rows");
      const int n = static_cast<int>(seg.tokens.size());
      const std::vector<int>& blocks = seg.kv->blocks();
      const int end = seg.start_pos + n;
      if (static_cast<int>(blocks.size()) * kKvBlockTokens < end) {
        throw std::runtime_error("cuda backend: a sequence's KV blocks do not cover its positions");
      }
      if (static_cast<int>(blocks.size()) > table_width_) {
        throw std::runtime_error("cuda backend: a sequence holds more KV blocks (" + std::to_string(blocks.size()) +
                                 ") than the block table is wide (" + std::to_string(table_width_) + ")");
      }
      h[layout.q_start + s] = row;
      h[layout.q_pos0 + s] = seg.start_pos;
      for (int i = 0; i < n; ++i) {
        const int pos = seg.start_pos + i;
        h[layout.tokens + row + i] = seg.tokens[i];
        h[layout.positions + row + i] = pos;
        h[layout.slots + row + i] = blocks[pos / kKvBlockTokens] * kKvBlockTokens + pos % kKvBlockTokens;
      }
      if (seg.want_logits) {
        for (int i = n - seg.logits_tail; i < n; ++i) h[layout.logit_rows + logit_row++] = row + i;
      }
      int32_t* table = h + layout.block_table + static_cast<size_t>(s) * table_width_;
      std::copy(blocks.begin(), blocks.end(), table);
      std::fill(table + blocks.size(), table + table_width_, 0);
      decode_only = decode_only && n == 1 && seg.want_logits && seg.logits_tail == 1;
      max_q_rows = std::max(max_q_rows, n);
      row += n;
    }
    h[layout.q_start + seqs] = row;
    cudaStream_t stream = stream_.get();
    LLMD_CUDA_CHECK(cudaMemcpyAsync(tables_.get(), h, layout.total * sizeof(int32_t), cudaMemcpyHostToDevice, stream));

    AttentionBatch batch;
    batch.num_seqs = seqs;
    batch.total_q_rows = rows;
    batch.max_q_rows = max_q_rows;
    batch.max_blocks_per_seq = table_width_;
    const int32_t* d = tables_.as<int32_t>();
    batch.q_start = d + layout.q_start;
    batch.q_pos0 = d + layout.q_pos0;
    batch.block_table = d + layout.block_table;
    attention_calls_[attention_path(batch, config_.head_dim)] += config_.n_layers;

    if (decode_only && env_flag("LLMD_CUDA_GRAPHS", true)) {
      // Keyed by the kernel choice too: LLMD_CUDA_MMA=0 sends 9..32 rows to the GEMV, which a graph
      // captured with the tensor-core kernel would not see.
      const int key = graph_key(seqs, env_flag("LLMD_CUDA_MMA", true));
      auto it = graphs_.find(key);
      if (it == graphs_.end()) {
        cudaGraph_t graph = nullptr;
        LLMD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
          run(layout, batch, rows, logit_count);
        } catch (...) {
          cudaStreamEndCapture(stream, &graph);
          if (graph != nullptr) cudaGraphDestroy(graph);
          throw;
        }
        LLMD_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        it = graphs_.emplace(key, GraphExec(graph)).first;
      }
      it->second.launch(stream);
    } else {
      run(layout, batch, rows, logit_count);
    }
    const size_t n_logits = static_cast<size_t>(logit_count) * config_.vocab_size;
    LLMD_CUDA_CHECK(cudaMemcpyAsync(logits_host_.as<float>(), logits_.get(), n_logits * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
    LLMD_CUDA_CHECK(cudaStreamSynchronize(stream));
    logits.assign(logits_host_.as<float>(), logits_host_.as<float>() + n_logits);
  }

 private:
  LayerKv layer_kv(int layer) const {
    LayerKv kv;
    const size_t layer_elems =
        static_cast<size_t>(kv_blocks_) * config_.n_kv_heads * kKvBlockTokens * config_.head_dim;
    kv.k = kv_k_.as<__half>() + layer * layer_elems;
    kv.v = kv_v_.as<__half>() + layer * layer_elems;
    kv.num_blocks = kv_blocks_;
    kv.n_kv_heads = config_.n_kv_heads;
    kv.head_dim = config_.head_dim;
    return kv;
  }

  // The KV store: every block the pool can hand out, allocated at the first step (the pool's
  // capacity is the engine's KV budget, known only then).
  void ensure_kv(KvPool& pool) {
    if (kv_blocks_ > 0) {
      // One model serves one engine's pool; a larger pool's block ids would index past the store.
      if (pool.capacity_blocks() > static_cast<size_t>(kv_blocks_)) {
        throw std::runtime_error("cuda backend: the KV pool grew past the device KV store");
      }
      return;
    }
    kv_blocks_ = static_cast<int>(pool.capacity_blocks());
    const size_t elems = static_cast<size_t>(kv_blocks_) * config_.n_layers * config_.n_kv_heads * kKvBlockTokens *
                         config_.head_dim;
    kv_k_ = DeviceBuffer(elems * sizeof(__half));
    kv_v_ = DeviceBuffer(elems * sizeof(__half));
    // A sequence can hold at most every block of the pool and at most its context's worth.
    const int context_blocks = (std::max(config_.context_length, 1) + kKvBlockTokens - 1) / kKvBlockTokens;
    table_width_ = std::max(1, std::min(kv_blocks_, context_blocks));
  }

  // Step buffers for `rows` token rows (grown, never shrunk; graphs captured against the old
  // buffers are dropped).
  void ensure_capacity(int rows) {
    if (rows <= capacity_rows_) return;
    const int cap = std::max(rows, std::max(capacity_rows_ * 2, kMaxGemvBatch));
    LLMD_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    graphs_.clear();
    const LlamaConfig& c = config_;
    const int widest = std::max({c.hidden_size, c.ffn_size, attn_dim_});
    x_ = DeviceBuffer(static_cast<size_t>(cap) * c.hidden_size * sizeof(float));
    qkv_ = DeviceBuffer(static_cast<size_t>(cap) * qkv_dim_ * sizeof(float));
    attn_ = DeviceBuffer(static_cast<size_t>(cap) * attn_dim_ * sizeof(float));
    ffn_ = DeviceBuffer(static_cast<size_t>(cap) * c.ffn_size * sizeof(float));
    if (!layers_.front().gate_up.stacked()) ffn_up_ = DeviceBuffer(static_cast<size_t>(cap) * c.ffn_size * sizeof(float));
    act_ = std::make_unique<Activations>(cap, widest);
    head_act_ = std::make_unique<Activations>(kMaxGemvBatch, c.hidden_size);
    head_x_ = DeviceBuffer(static_cast<size_t>(cap) * c.hidden_size * sizeof(float));
    const TableLayout most(cap, cap, cap, table_width_);
    staging_ = PinnedBuffer(most.total * sizeof(int32_t));
    tables_ = DeviceBuffer(most.total * sizeof(int32_t));
    size_t largest = 0;
    for (const Layer& l : layers_) {
      for (const auto* p : {&l.qkv, &l.gate_up}) {
        for (const DeviceMatrix& m : p->parts) largest = std::max(largest, static_cast<size_t>(m.rows) * m.cols);
      }
      largest = std::max({largest, static_cast<size_t>(l.wo.rows) * l.wo.cols, static_cast<size_t>(l.down.rows) * l.down.cols});
    }
    matmul_ = std::make_unique<MatmulContext>(cap, largest, stream_.get());
    AttentionBatch most_batch;
    most_batch.num_seqs = cap;
    most_batch.total_q_rows = cap;
    most_batch.max_q_rows = cap;
    most_batch.max_blocks_per_seq = table_width_;
    size_t ws = attention_workspace_bytes(most_batch, c.n_heads, c.head_dim);
    // A decode step's split plan depends on its sequence count (fewer sequences, more splits
    // each), so the workspace is the most any count up to the capacity needs.
    for (int seqs = 1; seqs <= cap; ++seqs) {
      AttentionBatch decode_batch = most_batch;
      decode_batch.num_seqs = seqs;
      decode_batch.total_q_rows = seqs;
      decode_batch.max_q_rows = 1;
      ws = std::max(ws, attention_workspace_bytes(decode_batch, c.n_heads, c.head_dim));
    }
    workspace_ = DeviceBuffer(std::max<size_t>(ws, 256));
    capacity_rows_ = cap;
  }

  // Logits rows (vocab floats each, on the device and pinned on the host): sized by the most
  // rows a step has returned so far, not by the step's token capacity (a 512-row prefill chunk
  // returns one row; 512 rows of a 128k vocabulary would be 262 MB on each side).
  void ensure_logit_rows(int n) {
    if (n <= logit_capacity_) return;
    const int cap = std::max(n, std::max(logit_capacity_ * 2, 8));
    LLMD_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    graphs_.clear();
    logits_ = DeviceBuffer(static_cast<size_t>(cap) * config_.vocab_size * sizeof(float));
    logits_host_ = PinnedBuffer(static_cast<size_t>(cap) * config_.vocab_size * sizeof(float));
    logit_capacity_ = cap;
  }

  // Every launch of one step, on stream_ (captured into a graph for decode steps).
  void run(const TableLayout& layout, const AttentionBatch& batch, int rows, int logit_count) {
    const LlamaConfig& c = config_;
    cudaStream_t stream = stream_.get();
    const int32_t* d = tables_.as<int32_t>();
    float* x = x_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();
    float* ffn = ffn_.as<float>();
    Activations& act = *act_;
    Rope rope;
    rope.inv_freq = inv_freq_.as<float>();
    rope.dims = c.rope_dims;
    rope.interleaved = c.rope_interleaved;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

    gather_rows(embedding(), d + layout.tokens, rows, x, stream);
    for (int l = 0; l < c.n_layers; ++l) {
      const Layer& L = layers_[l];
      const LayerKv kv = layer_kv(l);
      rmsnorm_quantize(x, c.hidden_size, L.attn_norm.as<float>(), c.rms_eps, rows, c.hidden_size, act, stream);
      for (size_t p = 0; p < L.qkv.parts.size(); ++p) {
        matmul(*matmul_, L.qkv.parts[p], act, qkv + L.qkv.offsets[p], qkv_dim_, Epilogue::Store, stream);
      }
      if (!L.qkv_bias.empty() || !L.q_norm.empty()) {
        qkv_bias_head_norm(qkv, qkv_dim_, rows, c.n_heads, c.n_kv_heads, c.head_dim, L.qkv_bias.as<float>(),
                           L.q_norm.as<float>(), L.k_norm.as<float>(), c.rms_eps, stream);
      }
      rope_write_kv(qkv, qkv_dim_, rows, c.n_heads, d + layout.positions, d + layout.slots, rope, kv, stream);
      paged_attention(qkv, qkv_dim_, batch, kv, c.n_heads, scale, attn, attn_dim_, workspace_.get(),
                      workspace_.bytes(), stream);
      quantize_activations(attn, attn_dim_, rows, attn_dim_, act, stream);
      matmul(*matmul_, L.wo, act, x, c.hidden_size, Epilogue::Add, stream);
      rmsnorm_quantize(x, c.hidden_size, L.ffn_norm.as<float>(), c.rms_eps, rows, c.hidden_size, act, stream);
      if (L.gate_up.stacked()) {
        matmul(*matmul_, L.gate_up.parts[0], act, ffn, c.ffn_size, Epilogue::SwiGLU, stream);
      } else {
        matmul(*matmul_, L.gate_up.parts[0], act, ffn, c.ffn_size, Epilogue::Store, stream);
        matmul(*matmul_, L.gate_up.parts[1], act, ffn_up_.as<float>(), c.ffn_size, Epilogue::Store, stream);
        swiglu_inplace(ffn, ffn_up_.as<float>(), c.ffn_size, rows, c.ffn_size, stream);
      }
      quantize_activations(ffn, c.ffn_size, rows, c.ffn_size, act, stream);
      matmul(*matmul_, L.down, act, x, c.hidden_size, Epilogue::Add, stream);
    }
    // The output matrix is the largest one (vocab x hidden): only the rows the engine samples
    // from go through it, as GEMVs (never the dequantizing path, which would need a float16 copy
    // of the whole matrix).
    float* head_x = head_x_.as<float>();
    copy_rows(x, c.hidden_size, d + layout.logit_rows, logit_count, c.hidden_size, head_x, c.hidden_size, stream);
    const int chunk = gemv_row_limit();
    for (int first = 0; first < logit_count; first += chunk) {
      const int n = std::min(chunk, logit_count - first);
      rmsnorm_quantize(head_x + static_cast<size_t>(first) * c.hidden_size, c.hidden_size, out_norm_.as<float>(),
                       c.rms_eps, n, c.hidden_size, *head_act_, stream);
      matmul(*matmul_, lm_head_, *head_act_, logits_.as<float>() + static_cast<size_t>(first) * c.vocab_size,
             c.vocab_size, Epilogue::Store, stream);
    }
  }

  LlamaConfig config_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  DeviceBuffer out_norm_;
  DeviceMatrix lm_head_;
  DeviceMatrix embed_;  // empty when tied_: the lookup reads lm_head_'s rows
  bool tied_;
  DeviceBuffer inv_freq_;
  int qkv_dim_ = 0;
  int attn_dim_ = 0;
  Stream stream_;

  int kv_blocks_ = 0;
  int table_width_ = 0;
  DeviceBuffer kv_k_, kv_v_;

  int capacity_rows_ = 0;
  int logit_capacity_ = 0;
  DeviceBuffer x_, qkv_, attn_, ffn_, ffn_up_, head_x_, logits_, tables_, workspace_;
  PinnedBuffer logits_host_, staging_;
  std::unique_ptr<Activations> act_, head_act_;
  std::unique_ptr<MatmulContext> matmul_;
  std::map<int, GraphExec> graphs_;
  std::map<std::string, uint64_t> attention_calls_;

  const DeviceMatrix& embedding() const { return tied_ ? lm_head_ : embed_; }
};

}  // namespace

int decode_graph_nodes(const Model& model, int seqs) {
  const auto* cuda_model = dynamic_cast<const CudaLlama*>(&model);
  return cuda_model ? cuda_model->graph_nodes(seqs) : -1;
}

std::unique_ptr<Model> load_llama(const GgufFile& file, const LlamaConfig& config, ModelInfo info) {
  if (!cuda_available()) throw std::runtime_error("backend 'cuda' requested but no CUDA device is present");
  if (config.head_dim % 2 != 0 || config.rope_dims > config.head_dim) {
    throw std::runtime_error("cuda backend: unsupported head size " + std::to_string(config.head_dim));
  }
  std::vector<Layer> layers(config.n_layers);
  for (int i = 0; i < config.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    Layer& L = layers[i];
    L.attn_norm = upload_vector(file.tensor(b + "attn_norm.weight"));
    L.ffn_norm = upload_vector(file.tensor(b + "ffn_norm.weight"));
    L.qkv = upload_product({&file.tensor(b + "attn_q.weight"), &file.tensor(b + "attn_k.weight"),
                            &file.tensor(b + "attn_v.weight")});
    if (config.qkv_bias) {
      std::vector<float> bias;
      for (const char* part : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) {
        const TensorView& t = file.tensor(b + part);
        const size_t at = bias.size();
        bias.resize(at + static_cast<size_t>(t.n_elements()));
        dequantize_row(t.type, t.data, bias.data() + at, t.n_elements());
      }
      L.qkv_bias = DeviceBuffer(bias.size() * sizeof(float));
      L.qkv_bias.upload(bias.data(), L.qkv_bias.bytes());
    }
    if (config.qk_norm) {
      L.q_norm = upload_vector(file.tensor(b + "attn_q_norm.weight"));
      L.k_norm = upload_vector(file.tensor(b + "attn_k_norm.weight"));
    }
    const TensorView& wo = file.tensor(b + "attn_output.weight");
    L.wo = upload_gguf_matrix(wo.type, wo.data, static_cast<int>(wo.shape[1]), static_cast<int>(wo.shape[0]));
    L.gate_up = upload_product({&file.tensor(b + "ffn_gate.weight"), &file.tensor(b + "ffn_up.weight")});
    const TensorView& down = file.tensor(b + "ffn_down.weight");
    L.down = upload_gguf_matrix(down.type, down.data, static_cast<int>(down.shape[1]), static_cast<int>(down.shape[0]));
  }
  DeviceBuffer out_norm = upload_vector(file.tensor("output_norm.weight"));
  const TensorView& embd = file.tensor("token_embd.weight");
  const TensorView* output = file.find("output.weight");
  const TensorView& head = output ? *output : embd;
  DeviceMatrix lm_head =
      upload_gguf_matrix(head.type, head.data, static_cast<int>(head.shape[1]), static_cast<int>(head.shape[0]));
  DeviceMatrix embed;
  if (output) embed = upload_gguf_matrix(embd.type, embd.data, static_cast<int>(embd.shape[1]), static_cast<int>(embd.shape[0]));
  info.backend = "cuda";
  info.device_name = device_name();
  info.device_memory_bytes = device_memory_bytes();
  return std::make_unique<CudaLlama>(config, std::move(info), std::move(layers), std::move(out_norm),
                                     std::move(lm_head), std::move(embed), output == nullptr);
}

}  // namespace llmd::cuda
