// Pieces every decoder-only architecture file shares: the hyperparameters all of them have,
// the token embedding table, reading a safetensors checkpoint, the per-step row layout, the
// device backend's per-thread state, and the logits tail. An architecture file (llama.cpp,
// gemma3.cpp, ...) keeps only what makes it different: its config, weight names and layer.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <mlx/mlx.h>

#include "../core/gguf_file.h"
#include "../core/metadata.h"
#include "../core/model.h"
#include "../core/op_profile.h"
#include "device_attention.h"
#include "linear.h"
#include "paged_attention.h"
#include "rope.h"

namespace llmd {

namespace mx = mlx::core;

struct DecoderDims {
  int vocab_size = 0;
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ffn_size = 0;
  float rms_eps = 1e-5f;
  int context_length = 0;

  // Throws naming `arch` when the numbers cannot describe a model.
  void check(const std::string& arch) const;
};

ModelInfo make_info(const DecoderDims& d, const std::string& arch, const std::string& format,
                    const LoadOptions& options);

// Token embedding rows, looked up on the host (a gather of T rows is not worth a graph op).
class Embedding {
 public:
  Embedding() = default;
  Embedding(mx::array bytes, TensorType type, int dim) : bytes_(std::move(bytes)), type_(type), dim_(dim) {}
  // A tied lm_head's own quantized blocks as the table (stored once), in whatever layout the
  // head keeps them (row-major or the kernels' 8-row packing).
  static Embedding tied_to(const Linear& head);
  // An MLX affine-quantized table (mlx-lm checkpoints): packed uint32 [vocab, dim * bits / 32],
  // scales and biases [vocab, dim / group]; rows are dequantized as they are looked up.
  static Embedding mlx_affine(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits,
                              int group);
  size_t resident_bytes() const { return bytes_.nbytes() + (bits_ ? scales_.nbytes() + biases_.nbytes() : 0); }
  // Whether the table is `head`'s own blocks (a tied Q4_1 lm_head), stored once.
  bool shares(const Linear& head) const {
    return head.quantized() && !head.on_device() && bytes_.data<uint8_t>() == head.weight().data<uint8_t>();
  }
  // Float rows of `tokens` into out[i * dim ...], multiplied by `scale`.
  void lookup(const std::vector<int32_t>& tokens, float* out, float scale = 1.f) const;

 private:
  mx::array bytes_{0.f};
  TensorType type_ = TensorType::F32;
  int dim_ = 0;
  bool packed_ = false;  // rows in the 8-row packed layout (kernels/pack8.h)
  int bits_ = 0;  // MLX affine table when non-zero
  int group_ = 0;
  mx::array scales_{0.f};  // float32 [vocab, dim / group]
  mx::array biases_{0.f};
};

// An MLX-owned copy of a mapped GGUF tensor's bytes.
mx::array copy_bytes(const TensorView& t);
// A float embedding matrix [vocab, dim] as an F32 Embedding.
Embedding float_embedding(const mx::array& weight);

// The tensors of a Hugging Face safetensors directory (all *.safetensors files in it).
// MLX-quantized checkpoints (mlx-lm: config `quantization` {group_size, bits}, each quantized
// module `X` stored as X.weight (uint32-packed), X.scales, X.biases) are read as they are by
// linear() and embedding(); get() of such a weight gives its dequantized float32 values.
class Checkpoint {
 public:
  // `hf` (the flattened config.json) supplies the quantization; throws naming the setting
  // when it is one llmd cannot run.
  explicit Checkpoint(const std::string& dir, const Metadata* hf = nullptr);
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor as float32; throws naming it when the checkpoint lacks it.
  mx::array get(const std::string& name) const;
  std::optional<mx::array> find(const std::string& name) const;

  struct Quantization {
    int bits = 0;
    int group_size = 0;
  };
  // The quantization of module `module` (a name without ".weight"), when it is quantized.
  std::optional<Quantization> quantization(const std::string& module) const;
  // The modules' weights stacked into one Linear: kept quantized when all of them are (same
  // bits and group), else float32 as get() gives them.
  Linear linear(const std::vector<std::string>& modules, bool on_device, bool interleave_pairs = false) const;
  // The packed weight, scales and biases of a quantized module (nullopt when it is float).
  std::optional<Linear::MlxQuantized> quantized_parts(const std::string& module) const;
  // An embedding table, quantized rows kept quantized. With `tied_head` (the lm_head built
  // from the same module) in Q4_1 blocks, the lookup reads those blocks: one copy.
  Embedding embedding(const std::string& module, const Linear* tied_head = nullptr) const;
  bool quantized() const { return quant_.bits != 0; }
  // ModelInfo::weight_format: "safetensors", or "safetensors:mlx-affine4g64" when quantized.
  std::string format() const;
  // Bytes of the weights as stored (quantized size for MLX-quantized checkpoints).
  size_t stored_bytes() const;

 private:
  std::unordered_map<std::string, mx::array> tensors_;
  Quantization quant_;
  // mlx-lm's per-module settings (`quantization`: {"model.layers.0.mlp.gate": {bits, group_size}}).
  std::map<std::string, Quantization> overrides_;
};

// RoPE base frequency of a Hugging Face config: transformers 5 writes `rope_parameters`
// (per layer type for hybrid models: `layer_type` = "full_attention", ...), older configs a
// top-level `rope_theta`.
double hf_rope_theta(const Metadata& hf, double fallback, const std::string& layer_type = "");
// The rope scaling type ("" when none) and its factor, from either config shape.
std::pair<std::string, double> hf_rope_scaling(const Metadata& hf, const std::string& layer_type = "");

// Which layers of a Gemma-style config slide: `layer_types` ("sliding_attention" /
// "full_attention"; other types are refused naming `arch`) when the config lists them, else
// every `default_pattern`-th layer is full (sliding_window_pattern when the config has it).
// The count must match n_layers.
std::vector<bool> hf_sliding_layers(const Metadata& hf, int n_layers, int default_pattern, const std::string& arch);
// Layer i slides unless it is the last of each `pattern` layers (Gemma 3: every 6th layer is
// global), as transformers' sliding_window_pattern and llama.cpp's set_swa_pattern.
std::vector<bool> sliding_pattern(int n_layers, int pattern);
// Gemma's MLP activation: only GELU-tanh is implemented; anything else is refused naming `arch`.
void require_gelu_tanh(const Metadata& hf, const std::string& arch);

// Host-side layout of one step: embedded rows, the attention batch and the rows sampled.
struct StepRows {
  std::vector<float> x;                  // [T, hidden] embeddings
  std::shared_ptr<AttentionBatch> batch;
  std::vector<int32_t> logit_rows;       // rows whose logits are returned (segment order)
  // Per logits row: sampled on the device when set (StepSegment::device_sample), and where
  // the tokens go (Step::device_tokens); only set when the model samples on the device.
  std::vector<std::optional<StepSegment::DeviceSample>> row_samples;
  std::vector<int32_t>* device_tokens = nullptr;
  struct HiddenSpan {
    int first, n;
    HiddenOut mode;
  };
  std::vector<HiddenSpan> hidden_spans;  // segments that want final hidden states
  int total = 0;
};
StepRows embed_step(const Step& step, KvPool& pool, const Embedding& embed, int hidden, float embed_scale = 1.f);

// What the device backend (MLX's kernels, KV in MLX arrays) keeps between steps.
class DeviceState {
 public:
  explicit DeviceState(bool on_device) : on_device_(on_device), device_(mx::default_device()) {}
  bool on_device() const { return on_device_; }
  // Makes this thread's graph go to the model's device on a stream of its own, and the KV
  // store cover every block the pool has handed out.
  DeviceKvStore& prepare(KvPool& pool, const KvShape& shape);
  void copy_kv_block(KvPool& pool, const KvShape& shape, int src, int dst);
  // Model::read_kv_blocks / write_kv_blocks: the store's rows on the device (DeviceKvStore::
  // read_blocks), the pool's own bytes on the CPU backend.
  void read_kv_blocks(KvPool& pool, const KvShape& shape, const std::vector<int>& blocks, bool window,
                      const std::vector<std::byte*>& out);
  void write_kv_blocks(KvPool& pool, const KvShape& shape, const std::vector<int>& blocks, bool window,
                       const std::vector<const std::byte*>& in);
  // Model::attention_paths: how the steps' attention read KV (decode_lanes.h).
  std::map<std::string, uint64_t> attention_paths() const { return paths_.snapshot(); }
  // Where the CPU kernels count theirs (AttentionBatch::counts).
  AttentionPathCounts* path_counts() { return &paths_; }

 private:
  bool on_device_;
  mx::Device device_;
  AttentionPathCounts paths_;
  std::unique_ptr<DeviceKvStore> kv_;
};

// A model whose KV lives where its DeviceState says (the device store's rows, or the pool's
// bytes on the CPU backend): copying a block and the disk tier's block I/O go through that
// state, the same way for every such model, so they are written once here.
class DeviceStateModel : public Model {
 public:
  void copy_kv_block(KvPool& pool, int src, int dst) override {
    device_state().copy_kv_block(pool, kv_shape(), src, dst);
  }
  bool has_kv_block_io() const override { return true; }
  void read_kv_blocks(KvPool& pool, const std::vector<int>& blocks, bool window,
                      const std::vector<std::byte*>& out) override {
    device_state().read_kv_blocks(pool, kv_shape(), blocks, window, out);
  }
  void write_kv_blocks(KvPool& pool, const std::vector<int>& blocks, bool window,
                       const std::vector<const std::byte*>& in) override {
    device_state().write_kv_blocks(pool, kv_shape(), blocks, window, in);
  }

 protected:
  virtual DeviceState& device_state() = 0;
};

// Which matmul path each weight of a decoder's layers runs (the engine reports it; tests check
// that no fp32 copy or MLX quantized_matmul is on a GGUF model's hot path). `Layer` has the
// fused projections qkv, wo, gate_up and down.
template <class Layer>
std::map<std::string, std::string> decoder_matmul_paths(const std::vector<Layer>& layers, const Linear& lm_head) {
  std::map<std::string, std::string> paths;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    paths[p + "attn_qkv"] = layers[i].qkv.path();
    paths[p + "attn_output"] = layers[i].wo.path();
    paths[p + "ffn_gate_up"] = layers[i].gate_up.path();
    paths[p + "ffn_down"] = layers[i].down.path();
  }
  paths["output"] = lm_head.path();
  return paths;
}

// Resident bytes of a decoder's matmul weights and embedding table (ModelInfo::weight_bytes
// of a safetensors load; norms and biases are not counted).
template <class Layer>
size_t decoder_weight_bytes(const std::vector<Layer>& layers, const Linear& lm_head, const Embedding& embed) {
  size_t n = lm_head.resident_bytes() + (embed.shares(lm_head) ? 0 : embed.resident_bytes());
  for (const Layer& L : layers) {
    n += L.qkv.resident_bytes() + L.wo.resident_bytes() + L.gate_up.resident_bytes() + L.down.resident_bytes();
  }
  return n;
}

// KV layout of a model whose layers all have `n_kv_heads` x `head_dim` keys and values.
KvShape decoder_kv_shape(const DecoderDims& d, bool on_device);

// RMSNorm of each head of x [rows, heads * head_dim] with one weight [head_dim] (QK-norm), or
// none (Gemma 4's value norm). On the device path (`compiled`) one compiled function
// (compiled_ops.h); on the host backend MLX's op.
mx::array head_rms_norm(const mx::array& x, const std::optional<mx::array>& weight, int heads, int head_dim, float eps,
                        bool compiled);

// Device backend, last layer: the rows the step's outputs read, when they are fewer than all
// (a prefill chunk samples only its last row). After the last layer's attention, which still
// writes every row's keys and values, only these rows go through the output projection and
// the feed-forward; llama.cpp skips the same work (its `inp_out_ids`), mlx-lm does not. On
// `rows` the logits rows are renumbered into the kept rows, and the attention output and the
// residual are cut to them; the kept indices are returned for any other per-row input the
// layer still reads. Nothing is cut (nullopt) when every row is read, or when an embedding
// segment reads hidden states.
std::optional<mx::array> keep_output_rows(StepRows& rows, mx::array& attention_out, mx::array& residual);

// Device backend: starts evaluating a layer's output while the host builds the next layer's
// graph. Without it the device idles until the whole step is built (graph building is ~1% of
// a decode step on MLX's CPU device, more on a fast GPU); mlx-lm hides the same cost by
// building step n+1 while step n runs (mx.async_eval), which llmd's engine cannot, since it
// samples on the host before the next step exists.
void start_layer(const mx::array& x);
// Device backend: starts evaluating KV-store writes that nothing else in the step reads (a
// batched decode reads its lanes, decode_lanes.h), so they run with the step instead of
// piling up as a lazy chain of scatters until some later step reads the store.
void start_writes(const std::vector<mx::array>& arrays);

// Logits of the sampled rows: final norm, lm_head, optional soft-capping
// (cap * tanh(logits / cap)), evaluated and copied into `logits`. With no sampled rows, only
// evaluates x (the step's KV writes). `build_timer` (graph building) stops before evaluation.
void compute_logits(const mx::array& x, const std::vector<int32_t>& rows, const Linear& lm_head,
                    const mx::array& norm, float eps, float softcap, std::vector<float>& logits,
                    std::optional<ScopedOpTimer>& build_timer);
// compute_logits, plus the final-norm hidden states the step's embedding segments asked for
// (one row per span into `hidden`, [spans, hidden_size]), evaluated in the same graph.
void compute_outputs(const mx::array& x, const StepRows& rows, const Linear& lm_head, const mx::array& norm,
                     float eps, float softcap, std::vector<float>& logits, std::vector<float>& hidden,
                     std::optional<ScopedOpTimer>& build_timer);

}  // namespace llmd
