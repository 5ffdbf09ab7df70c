// Gemma 3 text decoder (Hugging Face `gemma3_text` / Gemma3ForCausalLM, the text half of
// `gemma3`, and GGUF `gemma3`): embeddings scaled by sqrt(hidden); RMSNorm as x * (1 + w)
// (llama.cpp's converter stores 1 + w); sandwich norms around attention and the MLP; a
// GELU-tanh gated MLP; QK-norm; queries scaled by query_pre_attn_scalar^-0.5; sliding-window
// layers (their own RoPE base, no scaling) interleaved with global ones (the config's RoPE base
// and scaling); optional final logit soft-capping.
//
// Sliding layers attend to the last `sliding_window` positions only and keep only that window
// of KV (the pool's window parts, kv_cache.h), so their memory does not grow with the context.
#include <cmath>
#include <optional>
#include <stdexcept>

#include "../core/op_profile.h"
#include "architectures.h"
#include "decoder.h"

namespace llmd {

namespace {

struct Gemma3Config {
  DecoderDims dims;
  float query_scale = 0.f;  // query_pre_attn_scalar^-0.5
  int sliding_window = 0;   // 0: no sliding layers
  std::vector<bool> sliding;
  float final_softcap = 0.f;
};

struct Layer {
  mx::array attn_norm{0.f};
  mx::array q_norm{0.f};
  mx::array k_norm{0.f};
  mx::array post_attn_norm{0.f};
  mx::array ffn_norm{0.f};
  mx::array post_ffn_norm{0.f};
  Linear qkv;
  Linear wo;
  Linear gate_up;  // gate rows then up rows (not interleaved: no fused GELU epilogue)
  Linear down;
};

// GELU with the tanh approximation (gelu_pytorch_tanh) of the gate, times up.
mx::array gelu_tanh_glu(const mx::array& gate_up, int ffn) {
  const int rows = gate_up.shape(0);
  mx::array g = mx::slice(gate_up, {0, 0}, {rows, ffn});
  mx::array u = mx::slice(gate_up, {0, ffn}, {rows, 2 * ffn});
  const float c = std::sqrt(2.f / static_cast<float>(M_PI));
  mx::array cube = mx::multiply(mx::multiply(g, g), g);
  mx::array inner = mx::multiply(mx::array(c), mx::add(g, mx::multiply(mx::array(0.044715f), cube)));
  mx::array gelu = mx::multiply(mx::multiply(mx::array(0.5f), g), mx::add(mx::array(1.f), mx::tanh(inner)));
  return mx::multiply(gelu, u);
}

class Gemma3Model : public Model {
 public:
  Gemma3Model(Gemma3Config cfg, ModelInfo info, std::vector<Layer> layers, mx::array out_norm, Linear lm_head,
              Embedding embed, std::shared_ptr<const Rope> global_rope, std::shared_ptr<const Rope> local_rope)
      : cfg_(std::move(cfg)), info_(std::move(info)), layers_(std::move(layers)), out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)), embed_(std::move(embed)), global_rope_(std::move(global_rope)),
        local_rope_(std::move(local_rope)), device_(lm_head_.on_device()) {}

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }
  KvShape kv_shape() const override {
    // Sliding layers keep only their window of KV (kv_cache.h, "Window parts").
    KvShape shape = decoder_kv_shape(cfg_.dims, device_.on_device());
    shape.window = cfg_.sliding_window;
    shape.windowed = cfg_.sliding;
    return shape;
  }

  std::map<std::string, uint64_t> attention_paths() const override { return device_.attention_paths(); }
  // Images (siglip.cpp's rows): both backends' attention honour their bidirectional rows.
  bool accepts_embeddings() const override { return true; }

  std::map<std::string, std::string> matmul_paths() const override {
    return decoder_matmul_paths(layers_, lm_head_);
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const DecoderDims& d = cfg_.dims;
    StepRows rows = embed_step(step, pool, embed_, d.hidden_size, std::sqrt(static_cast<float>(d.hidden_size)));
    // Global and sliding layers see the same rows with their own RoPE tables and window.
    std::shared_ptr<AttentionBatch> global = rows.batch;
    auto local = std::make_shared<AttentionBatch>(*global);
    local->window = cfg_.sliding_window;
    if (!device_.on_device()) {  // host cos/sin for the CPU backend; the device path uses mx::fast::rope
      global->build_rope_tables(*global_rope_);
      local->build_rope_tables(*local_rope_);
    }
    const AttentionShape ashape{d.n_heads, d.n_kv_heads, d.head_dim, cfg_.query_scale};
    std::optional<DeviceAttentionPlan> global_plan, local_plan;
    DeviceKvStore* device_kv = nullptr;
    if (device_.on_device()) {
      device_kv = &device_.prepare(pool, kv_shape());
      global_plan = DeviceAttentionPlan::build(*global, *global_rope_, device_kv);
      local_plan = DeviceAttentionPlan::build(*local, *local_rope_, device_kv);
    }
    const int hd = d.head_dim, qw = d.n_heads * hd, kw = d.n_kv_heads * hd;
    mx::array x(rows.x.begin(), {rows.total, d.hidden_size}, mx::float32);
    for (int l = 0; l < d.n_layers; ++l) {
      const Layer& L = layers_[l];
      const bool sliding = cfg_.sliding[l];
      mx::array qkv = L.qkv(x, {.rms_norm_weight = L.attn_norm, .eps = d.rms_eps});
      const int T = rows.total;
      mx::array q = head_rms_norm(mx::slice(qkv, {0, 0}, {T, qw}), L.q_norm, d.n_heads, hd, d.rms_eps);
      mx::array k = head_rms_norm(mx::slice(qkv, {0, qw}, {T, qw + kw}), L.k_norm, d.n_kv_heads, hd, d.rms_eps);
      qkv = mx::concatenate({q, k, mx::slice(qkv, {0, qw + kw}, {T, qw + 2 * kw})}, 1);
      const auto& rope = sliding ? local_rope_ : global_rope_;
      mx::array a{0.f};
      if (device_kv) {
        a = device_attention(qkv, sliding ? *local_plan : *global_plan, l, ashape, *rope, *device_kv);
      } else {
        a = paged_attention(qkv, sliding ? local : global, l, ashape, rope);
      }
      x = mx::add(x, mx::fast::rms_norm(L.wo(a), L.post_attn_norm, d.rms_eps));
      mx::array h = gelu_tanh_glu(L.gate_up(x, {.rms_norm_weight = L.ffn_norm, .eps = d.rms_eps}), d.ffn_size);
      x = mx::add(x, mx::fast::rms_norm(L.down(h), L.post_ffn_norm, d.rms_eps));
      if (device_kv) start_layer(x);
    }
    compute_logits(x, rows.logit_rows, lm_head_, out_norm_, d.rms_eps, cfg_.final_softcap, logits, build_timer);
  }

  void copy_kv_block(KvPool& pool, int src, int dst) override { device_.copy_kv_block(pool, kv_shape(), src, dst); }

 private:
  Gemma3Config cfg_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  mx::array out_norm_;
  Linear lm_head_;
  Embedding embed_;
  std::shared_ptr<const Rope> global_rope_;
  std::shared_ptr<const Rope> local_rope_;
  DeviceState device_;
};

std::shared_ptr<Rope> make_rope(int dims, double theta, double linear_factor) {
  auto rope = std::make_shared<Rope>();
  rope->dims = dims;
  rope->interleaved = false;  // rotate-half, in both the HF layout and llama.cpp's (NEOX)
  rope->inv_freq = rope_inv_freq(dims, theta);
  for (float& f : rope->inv_freq) f = static_cast<float>(f / linear_factor);
  return rope;
}

// Scaling of one layer type's RoPE: none or linear (Gemma 3's 4B+ global layers).
double linear_factor(const std::string& type, double factor, const std::string& where) {
  if (type.empty()) return 1.0;
  if (type == "linear") return factor;
  throw std::runtime_error("gemma3 rope scaling type '" + type + "' (" + where + ") is not supported yet");
}

void check(const Gemma3Config& c) {
  c.dims.check("gemma3");
  if (static_cast<int>(c.sliding.size()) != c.dims.n_layers) {
    throw std::runtime_error("gemma3 layer types list has " + std::to_string(c.sliding.size()) + " entries for " +
                             std::to_string(c.dims.n_layers) + " layers");
  }
}

}  // namespace

std::unique_ptr<Model> load_gemma3_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  const Checkpoint w(dir, &hf);
  Gemma3Config c;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(hf.require_int("num_hidden_layers"));
  d.hidden_size = static_cast<int>(hf.require_int("hidden_size"));
  d.ffn_size = static_cast<int>(hf.require_int("intermediate_size"));
  d.n_heads = static_cast<int>(hf.require_int("num_attention_heads"));
  d.n_kv_heads = static_cast<int>(hf.get_int("num_key_value_heads").value_or(d.n_heads));
  d.head_dim = static_cast<int>(hf.get_int("head_dim").value_or(256));
  d.rms_eps = static_cast<float>(hf.get_float("rms_norm_eps").value_or(1e-6));
  d.context_length = static_cast<int>(hf.get_int("max_position_embeddings").value_or(131072));
  d.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  c.query_scale = static_cast<float>(1.0 / std::sqrt(hf.get_float("query_pre_attn_scalar").value_or(256.0)));
  c.final_softcap = static_cast<float>(hf.get_float("final_logit_softcapping").value_or(0.0));
  if (hf.get_float("attn_logit_softcapping")) {
    throw std::runtime_error("gemma3 attn_logit_softcapping is not supported (Gemma 3 checkpoints have none)");
  }
  if (hf.get_bool("use_bidirectional_attention").value_or(false)) {
    throw std::runtime_error("gemma3 with use_bidirectional_attention (an embedding model) is not supported");
  }
  require_gelu_tanh(hf, "gemma3");
  c.sliding_window = static_cast<int>(hf.get_int("sliding_window").value_or(4096));
  c.sliding = hf_sliding_layers(hf, d.n_layers, 6, "gemma3");
  check(c);

  const auto [global_type, global_factor] = hf_rope_scaling(hf, "full_attention");
  auto global_rope = make_rope(d.head_dim, hf_rope_theta(hf, 1e6, "full_attention"),
                               linear_factor(global_type, global_factor, "global layers"));
  // Sliding layers: their own base (rope_local_base_freq in older configs) and no scaling; a
  // top-level rope_scaling belongs to the global layers.
  const double local_theta = hf.get_float("rope_parameters.sliding_attention.rope_theta")
                                 .value_or(hf.get_float("rope_local_base_freq").value_or(10000.0));
  const std::string lp = "rope_parameters.sliding_attention.";
  std::string local_type = hf.get_string(lp + "rope_type").value_or("");
  if (local_type == "default") local_type.clear();
  auto local_rope = make_rope(
      d.head_dim, local_theta,
      linear_factor(local_type, hf.get_float(lp + "factor").value_or(1.0), "sliding layers"));

  // Text-only checkpoints name the decoder `model.`; multimodal ones nest it.
  std::string m = "model.";
  for (const char* prefix : {"model.", "language_model.model.", "model.language_model."}) {
    if (w.has(std::string(prefix) + "embed_tokens.weight")) {
      m = prefix;
      break;
    }
  }
  // Gemma3RMSNorm multiplies by (1 + w): fold the 1 in once here.
  auto norm = [&](const std::string& name) {
    mx::array a = mx::add(w.get(name), mx::array(1.f));
    a.eval();
    return a;
  };
  const bool dev = options.on_device();
  std::vector<Layer> layers(d.n_layers);
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string b = m + "layers." + std::to_string(i) + ".";
    const std::string a = b + "self_attn.";
    Layer& L = layers[i];
    L.attn_norm = norm(b + "input_layernorm.weight");
    L.post_attn_norm = norm(b + "post_attention_layernorm.weight");
    L.ffn_norm = norm(b + "pre_feedforward_layernorm.weight");
    L.post_ffn_norm = norm(b + "post_feedforward_layernorm.weight");
    L.q_norm = norm(a + "q_norm.weight");
    L.k_norm = norm(a + "k_norm.weight");
    L.qkv = w.linear({a + "q_proj", a + "k_proj", a + "v_proj"}, dev);
    L.wo = w.linear({a + "o_proj"}, dev);
    L.gate_up = w.linear({b + "mlp.gate_proj", b + "mlp.up_proj"}, dev);
    L.down = w.linear({b + "mlp.down_proj"}, dev);
  }
  mx::array out_norm = norm(m + "norm.weight");
  // An untied head: top-level in text-only and transformers 5 checkpoints, inside the
  // language model in older multimodal ones. None stored means tied (as Gemma 3 ships).
  std::string head = "lm_head.weight";
  if (!w.has(head) && w.has("language_model.lm_head.weight")) head = "language_model.lm_head.weight";
  const bool tied = !w.has(head) || hf.get_bool("tie_word_embeddings").value_or(true);  // HF default
  Linear lm_head = w.linear({tied ? m + "embed_tokens" : head.substr(0, head.size() - 7)}, dev);
  Embedding embed = w.embedding(m + "embed_tokens", tied ? &lm_head : nullptr);
  ModelInfo info = make_info(d, "gemma3", w.format(), options);
  info.weight_bytes = decoder_weight_bytes(layers, lm_head, embed);
  return std::make_unique<Gemma3Model>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                       global_rope, local_rope);
}

std::unique_ptr<Model> load_gemma3_gguf(const GgufFile& file, const LoadOptions& options) {
  const Metadata& meta = file.metadata();
  const std::string p = "gemma3.";
  Gemma3Config c;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(meta.require_int(p + "block_count"));
  d.hidden_size = static_cast<int>(meta.require_int(p + "embedding_length"));
  d.ffn_size = static_cast<int>(meta.require_int(p + "feed_forward_length"));
  d.n_heads = static_cast<int>(meta.require_int(p + "attention.head_count"));
  d.n_kv_heads = static_cast<int>(meta.get_int(p + "attention.head_count_kv").value_or(d.n_heads));
  d.head_dim = static_cast<int>(meta.get_int(p + "attention.key_length").value_or(256));
  d.rms_eps = static_cast<float>(meta.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  d.context_length = static_cast<int>(meta.get_int(p + "context_length").value_or(131072));
  const TensorView& embd = file.tensor("token_embd.weight");
  d.vocab_size = static_cast<int>(embd.shape[1]);
  // GGUF has no query_pre_attn_scalar: llama.cpp derives it (hidden / heads for the 62-layer
  // 27B model, head_dim otherwise), and so do we, to compute what llama.cpp computes.
  const int scalar = d.n_layers == 62 ? d.hidden_size / d.n_heads : d.head_dim;
  c.query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(scalar)));
  c.final_softcap = static_cast<float>(meta.get_float(p + "final_logit_softcapping").value_or(0.0));
  c.sliding_window = static_cast<int>(meta.get_int(p + "attention.sliding_window").value_or(0));
  const auto& values = meta.values();
  auto pattern = values.find(p + "attention.sliding_window_pattern");
  if (c.sliding_window <= 0) {
    c.sliding.assign(d.n_layers, false);
  } else if (pattern != values.end() && std::holds_alternative<std::vector<int64_t>>(pattern->second)) {
    for (int64_t v : std::get<std::vector<int64_t>>(pattern->second)) c.sliding.push_back(v != 0);
  } else {
    const int every = static_cast<int>(meta.get_int(p + "attention.sliding_window_pattern").value_or(6));
    c.sliding = sliding_pattern(d.n_layers, every);
  }
  check(c);

  const int rope_dims = static_cast<int>(meta.get_int(p + "rope.dimension_count").value_or(d.head_dim));
  const std::string scaling = meta.get_string(p + "rope.scaling.type").value_or("none");
  auto global_rope = make_rope(rope_dims, meta.get_float(p + "rope.freq_base").value_or(1e6),
                               linear_factor(scaling == "none" ? "" : scaling,
                                             meta.get_float(p + "rope.scaling.factor").value_or(1.0), "global layers"));
  auto local_rope = make_rope(rope_dims, meta.get_float(p + "rope.freq_base_swa").value_or(10000.0), 1.0);

  const bool dev = options.on_device();
  std::vector<Layer> layers(d.n_layers);
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    Layer& L = layers[i];
    // llama.cpp's converter already stored 1 + w for every Gemma 3 norm.
    L.attn_norm = dequantize_tensor(file.tensor(b + "attn_norm.weight"));
    L.q_norm = dequantize_tensor(file.tensor(b + "attn_q_norm.weight"));
    L.k_norm = dequantize_tensor(file.tensor(b + "attn_k_norm.weight"));
    L.post_attn_norm = dequantize_tensor(file.tensor(b + "post_attention_norm.weight"));
    L.ffn_norm = dequantize_tensor(file.tensor(b + "ffn_norm.weight"));
    L.post_ffn_norm = dequantize_tensor(file.tensor(b + "post_ffw_norm.weight"));
    const TensorView* q = &file.tensor(b + "attn_q.weight");
    const TensorView* k = &file.tensor(b + "attn_k.weight");
    const TensorView* v = &file.tensor(b + "attn_v.weight");
    L.qkv = Linear::from_gguf({q, k, v}, false, dev);
    L.wo = Linear::from_gguf({&file.tensor(b + "attn_output.weight")}, false, dev);
    const TensorView* gate = &file.tensor(b + "ffn_gate.weight");
    const TensorView* up = &file.tensor(b + "ffn_up.weight");
    L.gate_up = Linear::from_gguf({gate, up}, false, dev);
    L.down = Linear::from_gguf({&file.tensor(b + "ffn_down.weight")}, false, dev);
  }
  mx::array out_norm = dequantize_tensor(file.tensor("output_norm.weight"));
  const TensorView* output = file.find("output.weight");
  Linear lm_head = Linear::from_gguf({output ? output : &embd}, false, dev);
  Embedding embed = (!output && lm_head.quantized() && !dev) ? Embedding::tied_to(lm_head)
                                                             : Embedding(copy_bytes(embd), embd.type, d.hidden_size);
  ModelInfo info = make_info(d, "gemma3", "gguf:" + type_name(file.tensor("blk.0.ffn_down.weight").type), options);
  info.weight_bytes = file.file_size();
  return std::make_unique<Gemma3Model>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                       global_rope, local_rope);
}

}  // namespace llmd
