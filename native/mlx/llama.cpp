#include "llama.h"

#include <cmath>
#include <optional>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "../core/dequantize.h"
#include "../core/op_profile.h"
#include "device_attention.h"
#include "linear.h"
#include "paged_attention.h"

namespace llmd {

namespace {

struct LlamaConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ffn_size = 0;
  float rms_eps = 1e-5f;
  int context_length = 0;
};

struct Layer {
  mx::array attn_norm{0.f};
  mx::array ffn_norm{0.f};
  Linear qkv;
  Linear wo;
  Linear gate_up;
  Linear down;
};

// Token embedding rows, looked up on the host (a gather of T rows is not worth a graph op).
class Embedding {
 public:
  Embedding() = default;
  Embedding(mx::array bytes, TensorType type, int dim) : bytes_(std::move(bytes)), type_(type), dim_(dim) {}
  void lookup(const std::vector<int32_t>& tokens, float* out) const {
    const size_t rb = row_bytes(type_, dim_);
    const uint8_t* base = bytes_.data<uint8_t>();
    for (size_t i = 0; i < tokens.size(); ++i) {
      dequantize_row(type_, base + static_cast<size_t>(tokens[i]) * rb, out + i * dim_, dim_);
    }
  }

 private:
  mx::array bytes_{0.f};
  TensorType type_ = TensorType::F32;
  int dim_ = 0;
};

mx::array copy_bytes(const TensorView& t) {
  mx::array a = owned_bytes(t.n_bytes);
  std::memcpy(a.data<uint8_t>(), t.data, t.n_bytes);
  return a;
}

class LlamaModel : public Model {
 public:
  LlamaModel(LlamaConfig cfg, ModelInfo info, std::vector<Layer> layers, mx::array out_norm,
             Linear lm_head, Embedding embed, std::shared_ptr<const Rope> rope)
      : cfg_(cfg), info_(std::move(info)), layers_(std::move(layers)), out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)), embed_(std::move(embed)), rope_(std::move(rope)),
        on_device_(lm_head_.on_device()), device_(mx::default_device()) {}

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }
  KvShape kv_shape() const override {
    // The device backend keeps KV in MLX arrays of its compute dtype (device_attention.h).
    return {cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, !on_device_,
            on_device_ ? static_cast<int>(mx::size_of(device_compute_dtype())) : 4};
  }

  std::map<std::string, std::string> matmul_paths() const override {
    std::map<std::string, std::string> paths;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      paths[p + "attn_qkv"] = layers_[i].qkv.path();
      paths[p + "attn_output"] = layers_[i].wo.path();
      paths[p + "ffn_gate_up"] = layers_[i].gate_up.path();
      paths[p + "ffn_down"] = layers_[i].down.path();
    }
    paths["output"] = lm_head_.path();
    return paths;
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const int T = step.total_tokens();
    const int D = cfg_.hidden_size;
    auto batch = std::make_shared<AttentionBatch>();
    batch->pool = &pool;
    std::vector<float> x_host(static_cast<size_t>(T) * D);
    std::vector<int32_t> logit_rows;
    int row = 0;
    for (const StepSegment& seg : step.segments) {
      const int n = static_cast<int>(seg.tokens.size());
      embed_.lookup(seg.tokens, x_host.data() + static_cast<size_t>(row) * D);
      batch->segments.push_back({seg.kv, row, n, seg.start_pos});
      row += n;
      if (seg.want_logits) logit_rows.push_back(row - 1);
    }
    batch->build_rope_tables(*rope_);
    const AttentionShape ashape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                                1.f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    std::optional<DeviceAttentionPlan> plan;
    if (on_device_) {
      mx::set_default_device(device_);  // the engine thread builds this step's graph
      // MLX's GPU streams belong to the thread that made them: give each thread that runs
      // steps (the engine's, or a caller of score()) a stream of its own.
      thread_local bool has_stream = false;
      if (!has_stream) {
        mx::set_default_stream(mx::new_stream(device_));
        has_stream = true;
      }
      if (!device_kv_) device_kv_ = std::make_unique<DeviceKvStore>(kv_shape());
      device_kv_->ensure_blocks(pool.created_blocks(), pool.capacity_blocks());
      plan = DeviceAttentionPlan::build(*batch, rope_->dims);
    }
    mx::array x(x_host.begin(), {T, D}, mx::float32);
    // Five ops per layer: norm+qkv, attention, o+residual, norm+gate/up+SwiGLU, down+residual.
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const Layer& L = layers_[l];
      mx::array qkv = L.qkv(x, {.rms_norm_weight = L.attn_norm, .eps = cfg_.rms_eps});
      mx::array a = plan ? device_attention(qkv, *plan, l, ashape, *rope_, *device_kv_)
                         : paged_attention(qkv, batch, l, ashape, rope_);
      x = L.wo(a, {.residual = x});
      mx::array h = L.gate_up(x, {.rms_norm_weight = L.ffn_norm, .eps = cfg_.rms_eps, .swiglu = true});
      x = L.down(h, {.residual = x});
    }
    if (logit_rows.empty()) {
      build_timer.reset();
      mx::eval(x);
      logits.clear();
      return;
    }
    mx::array idx(logit_rows.begin(), {static_cast<int>(logit_rows.size())}, mx::int32);
    mx::array last = mx::take(x, idx, 0);
    mx::array out = lm_head_(last, {.rms_norm_weight = out_norm_, .eps = cfg_.rms_eps});
    out = mx::astype(out, mx::float32);
    build_timer.reset();
    mx::eval(out);
    logits.resize(out.size());
    std::memcpy(logits.data(), out.data<float>(), out.nbytes());
  }

  void copy_kv_block(KvPool& pool, int src, int dst) override {
    if (!on_device_) {
      pool.copy_block(src, dst);
      return;
    }
    // The source block was written by an earlier step, so the store exists.
    device_kv_->ensure_blocks(pool.created_blocks(), pool.capacity_blocks());
    device_kv_->copy_block(src, dst);
  }

 private:
  LlamaConfig cfg_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  mx::array out_norm_;
  Linear lm_head_;
  Embedding embed_;
  std::shared_ptr<const Rope> rope_;
  bool on_device_;
  mx::Device device_;
  std::unique_ptr<DeviceKvStore> device_kv_;  // KV storage of the device backend
};

ModelInfo make_info(const LlamaConfig& c, const std::string& format) {
  ModelInfo info;
  info.architecture = "llama";
  info.vocab_size = c.vocab_size;
  info.context_length = c.context_length;
  info.n_layers = c.n_layers;
  info.n_heads = c.n_heads;
  info.n_kv_heads = c.n_kv_heads;
  info.head_dim = c.head_dim;
  info.hidden_size = c.hidden_size;
  info.weight_format = format;
  return info;
}

void check_config(const LlamaConfig& c) {
  if (c.n_layers <= 0 || c.hidden_size <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.n_heads % c.n_kv_heads != 0 || c.head_dim <= 0 || c.ffn_size <= 0) {
    throw std::runtime_error("inconsistent llama hyperparameters in model metadata");
  }
}

}  // namespace

std::unique_ptr<Model> load_llama_gguf(const GgufFile& file, const LoadOptions& options) {
  const Metadata& m = file.metadata();
  const std::string arch = m.get_string("general.architecture").value_or("llama");
  const std::string p = arch + ".";
  LlamaConfig c;
  c.n_layers = static_cast<int>(m.require_int(p + "block_count"));
  c.hidden_size = static_cast<int>(m.require_int(p + "embedding_length"));
  c.ffn_size = static_cast<int>(m.require_int(p + "feed_forward_length"));
  c.n_heads = static_cast<int>(m.require_int(p + "attention.head_count"));
  c.n_kv_heads = static_cast<int>(m.get_int(p + "attention.head_count_kv").value_or(c.n_heads));
  c.head_dim = static_cast<int>(m.get_int(p + "attention.key_length").value_or(c.hidden_size / c.n_heads));
  c.rms_eps = static_cast<float>(m.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.context_length = static_cast<int>(m.get_int(p + "context_length").value_or(4096));
  const TensorView& embd = file.tensor("token_embd.weight");
  c.vocab_size = static_cast<int>(embd.shape[1]);
  check_config(c);

  auto rope = std::make_shared<Rope>();
  rope->dims = static_cast<int>(m.get_int(p + "rope.dimension_count").value_or(c.head_dim));
  rope->interleaved = true;  // GGUF's converter permutes llama Q/K for interleaved rotation
  std::vector<float> factors;
  if (const TensorView* f = file.find("rope_freqs.weight")) {
    factors.resize(f->n_elements());
    dequantize_row(f->type, f->data, factors.data(), f->n_elements());
  }
  rope->inv_freq = rope_inv_freq(rope->dims, m.get_float(p + "rope.freq_base").value_or(10000.0), factors);
  if (m.get_string(p + "rope.scaling.type").value_or("") == "linear") {
    const double factor = m.get_float(p + "rope.scaling.factor").value_or(1.0);
    for (float& f : rope->inv_freq) f = static_cast<float>(f / factor);
  }

  const bool dev = options.on_device();
  std::vector<Layer> layers(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    Layer& L = layers[i];
    L.attn_norm = dequantize_tensor(file.tensor(b + "attn_norm.weight"));
    L.ffn_norm = dequantize_tensor(file.tensor(b + "ffn_norm.weight"));
    const TensorView* q = &file.tensor(b + "attn_q.weight");
    const TensorView* k = &file.tensor(b + "attn_k.weight");
    const TensorView* v = &file.tensor(b + "attn_v.weight");
    if (q->type == k->type && k->type == v->type) {
      L.qkv = Linear::from_gguf({q, k, v}, false, dev);
    } else {
      throw std::runtime_error("mixed quantization types within one attention block (" + type_name(q->type) +
                               "/" + type_name(k->type) + "/" + type_name(v->type) +
                               ") are not supported yet");
    }
    L.wo = Linear::from_gguf({&file.tensor(b + "attn_output.weight")}, false, dev);
    const TensorView* gate = &file.tensor(b + "ffn_gate.weight");
    const TensorView* up = &file.tensor(b + "ffn_up.weight");
    if (gate->type != up->type) {
      throw std::runtime_error("mixed quantization types for ffn_gate/ffn_up are not supported yet");
    }
    L.gate_up = Linear::from_gguf({gate, up}, /*interleave_pairs=*/true, dev);
    L.down = Linear::from_gguf({&file.tensor(b + "ffn_down.weight")}, false, dev);
  }
  mx::array out_norm = dequantize_tensor(file.tensor("output_norm.weight"));
  const TensorView* output = file.find("output.weight");
  Linear lm_head = Linear::from_gguf({output ? output : &embd}, false, dev);
  // Tied embeddings: the lookup reads the lm_head's rows, so the table is stored once (on the
  // CPU backend; the device backend's lm_head is in another format).
  Embedding embed = (!output && lm_head.quantized() && !dev)
                        ? Embedding(lm_head.weight(), embd.type, c.hidden_size)
                        : Embedding(copy_bytes(embd), embd.type, c.hidden_size);

  std::string format = "gguf:" + type_name(file.tensor("blk.0.ffn_down.weight").type);
  ModelInfo info = make_info(c, format);
  info.weight_bytes = file.file_size();
  if (options.context_length > 0) info.context_length = std::min(info.context_length, options.context_length);
  return std::make_unique<LlamaModel>(c, info, std::move(layers), out_norm, std::move(lm_head),
                                      std::move(embed), rope);
}

std::unique_ptr<Model> load_llama_safetensors(const std::string& dir, const Metadata& hf,
                                              const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::unordered_map<std::string, mx::array> w;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") {
      auto loaded = mx::load_safetensors(entry.path().string(), mx::default_stream(mx::Device::cpu));
      for (auto& [name, arr] : loaded.first) w.insert_or_assign(name, arr);
    }
  }
  if (w.empty()) throw std::runtime_error(dir + " holds no .safetensors files");
  auto get = [&](const std::string& name) -> mx::array {
    auto it = w.find(name);
    if (it == w.end()) throw std::runtime_error("checkpoint has no tensor '" + name + "'");
    return mx::astype(it->second, mx::float32);
  };
  LlamaConfig c;
  c.n_layers = static_cast<int>(hf.require_int("num_hidden_layers"));
  c.hidden_size = static_cast<int>(hf.require_int("hidden_size"));
  c.ffn_size = static_cast<int>(hf.require_int("intermediate_size"));
  c.n_heads = static_cast<int>(hf.require_int("num_attention_heads"));
  c.n_kv_heads = static_cast<int>(hf.get_int("num_key_value_heads").value_or(c.n_heads));
  c.head_dim = static_cast<int>(hf.get_int("head_dim").value_or(c.hidden_size / c.n_heads));
  c.rms_eps = static_cast<float>(hf.get_float("rms_norm_eps").value_or(1e-5));
  c.context_length = static_cast<int>(hf.get_int("max_position_embeddings").value_or(4096));
  c.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  check_config(c);

  auto rope = std::make_shared<Rope>();
  rope->dims = c.head_dim;
  rope->interleaved = false;  // Hugging Face layout rotates halves
  const double theta = hf.get_float("rope_theta").value_or(10000.0);
  std::vector<float> factors;
  const std::string rope_type = hf.get_string("rope_scaling.rope_type").value_or(hf.get_string("rope_scaling.type").value_or(""));
  if (rope_type == "llama3") {
    factors = llama3_rope_factors(c.head_dim, theta, hf.require_float("rope_scaling.factor"),
                                  hf.get_float("rope_scaling.low_freq_factor").value_or(1.0),
                                  hf.get_float("rope_scaling.high_freq_factor").value_or(4.0),
                                  static_cast<int>(hf.get_int("rope_scaling.original_max_position_embeddings").value_or(8192)));
  } else if (!rope_type.empty() && rope_type != "default" && rope_type != "linear") {
    throw std::runtime_error("rope scaling type '" + rope_type + "' is not supported yet");
  }
  rope->inv_freq = rope_inv_freq(rope->dims, theta, factors);
  if (rope_type == "linear") {
    const double factor = hf.require_float("rope_scaling.factor");
    for (float& f : rope->inv_freq) f = static_cast<float>(f / factor);
  }

  const bool dev = options.on_device();
  std::vector<Layer> layers(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string b = "model.layers." + std::to_string(i) + ".";
    Layer& L = layers[i];
    L.attn_norm = get(b + "input_layernorm.weight");
    L.ffn_norm = get(b + "post_attention_layernorm.weight");
    L.qkv = Linear::from_float(mx::concatenate({get(b + "self_attn.q_proj.weight"), get(b + "self_attn.k_proj.weight"),
                                                get(b + "self_attn.v_proj.weight")}, 0), dev);
    L.wo = Linear::from_float(get(b + "self_attn.o_proj.weight"), dev);
    L.gate_up = Linear::from_float(mx::concatenate({get(b + "mlp.gate_proj.weight"), get(b + "mlp.up_proj.weight")}, 0), dev);
    L.down = Linear::from_float(get(b + "mlp.down_proj.weight"), dev);
    mx::eval({L.attn_norm, L.ffn_norm});
  }
  mx::array embed_w = get("model.embed_tokens.weight");
  mx::array out_norm = get("model.norm.weight");
  const bool tied = hf.get_bool("tie_word_embeddings").value_or(w.find("lm_head.weight") == w.end());
  Linear lm_head = Linear::from_float(tied ? embed_w : get("lm_head.weight"), dev);
  mx::eval({embed_w, out_norm});
  mx::array embed_bytes = mx::view(mx::flatten(embed_w), mx::uint8);
  embed_bytes.eval();
  Embedding embed(embed_bytes, TensorType::F32, c.hidden_size);
  ModelInfo info = make_info(c, "safetensors");
  if (options.context_length > 0) info.context_length = std::min(info.context_length, options.context_length);
  return std::make_unique<LlamaModel>(c, info, std::move(layers), out_norm, std::move(lm_head),
                                      std::move(embed), rope);
}

}  // namespace llmd
