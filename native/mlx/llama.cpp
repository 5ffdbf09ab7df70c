#include "llama.h"

#include <cmath>
#include <optional>
#include <stdexcept>

#include "../core/dequantize.h"
#include "../core/op_profile.h"
#include "architectures.h"
#include "decoder.h"
#ifdef LLMD_WITH_CUDA
#include "../cuda/cuda_model.h"
#endif

namespace llmd {

namespace {

struct Layer {
  mx::array attn_norm{0.f};
  mx::array ffn_norm{0.f};
  Linear qkv;
  std::optional<mx::array> qkv_bias;  // [(n_heads + 2 * n_kv_heads) * head_dim]
  std::optional<mx::array> q_norm;    // [head_dim], with k_norm: QK-norm before RoPE
  std::optional<mx::array> k_norm;
  Linear wo;
  std::optional<mx::array> wo_bias;
  Linear gate_up;
  Linear down;
};

class LlamaModel : public DeviceStateModel {
 public:
  LlamaModel(DecoderDims dims, ModelInfo info, std::vector<Layer> layers, mx::array out_norm, Linear lm_head,
             Embedding embed, std::shared_ptr<const Rope> rope)
      : dims_(dims), info_(std::move(info)), layers_(std::move(layers)), out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)), embed_(std::move(embed)), rope_(std::move(rope)),
        device_(lm_head_.on_device()) {
    if (device_.on_device()) {
      // The device backend's activations are in the compute dtype: so are the vectors that
      // meet them (else MLX would promote each norm's output back to float32).
      std::vector<mx::array> all;
      auto to_compute = [&](mx::array& a) {
        a = mx::astype(a, device_compute_dtype(), mx::default_stream(mx::Device::cpu));
        all.push_back(a);
      };
      to_compute(out_norm_);
      for (Layer& L : layers_) {
        to_compute(L.attn_norm);
        to_compute(L.ffn_norm);
        for (auto* v : {&L.qkv_bias, &L.q_norm, &L.k_norm, &L.wo_bias}) {
          if (*v) to_compute(**v);
        }
      }
      mx::eval(all);
    }
  }

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }
  KvShape kv_shape() const override { return decoder_kv_shape(dims_, device_.on_device()); }

  std::map<std::string, uint64_t> attention_paths() const override { return device_.attention_paths(); }

  std::map<std::string, std::string> matmul_paths() const override {
    return decoder_matmul_paths(layers_, lm_head_);
  }

  bool supports_hidden() const override { return true; }
  bool samples_on_device() const override { return device_.on_device(); }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::vector<float> unused;
    forward(step, pool, logits, unused);
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits, std::vector<float>& hidden) override {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    StepRows rows = embed_step(step, pool, embed_, dims_.hidden_size);
    rows.batch->counts = device_.path_counts();
    // The CPU backend's attention reads host cos/sin tables; the device path rotates with
    // mx::fast::rope from the plan's positions and needs none.
    if (!device_.on_device()) rows.batch->build_rope_tables(*rope_);
    const AttentionShape ashape{dims_.n_heads, dims_.n_kv_heads, dims_.head_dim,
                                1.f / std::sqrt(static_cast<float>(dims_.head_dim))};
    std::optional<DeviceAttentionPlan> plan;
    DeviceKvStore* device_kv = nullptr;
    if (device_.on_device()) {
      device_kv = &device_.prepare(pool, kv_shape());
      plan = DeviceAttentionPlan::build(*rows.batch, *rope_, device_kv);
    }
    mx::array x(rows.x.begin(), {rows.total, dims_.hidden_size}, mx::float32);
    // Cast: the host's embedding rows are float32. On the device backend the residual stream
    // then stays in the compute dtype through every layer (norm weights and biases were
    // converted at load), as mlx-lm's does.
    if (device_.on_device()) x = mx::astype(x, device_compute_dtype());
    // Five ops per layer (plus bias and QK-norm where the variant has them): norm+qkv,
    // attention, o+residual, norm+gate/up+SwiGLU, down+residual.
    for (int l = 0; l < dims_.n_layers; ++l) {
      const Layer& L = layers_[l];
      mx::array qkv = L.qkv(x, {.rms_norm_weight = L.attn_norm, .eps = dims_.rms_eps});
      if (L.qkv_bias) qkv = mx::add(qkv, *L.qkv_bias);
      if (L.q_norm) qkv = norm_qk(qkv, L);
      mx::array a = plan ? device_attention(qkv, *plan, l, ashape, *rope_, *device_kv)
                         : paged_attention(qkv, rows.batch, l, ashape, rope_);
      if (l == dims_.n_layers - 1 && plan) {
        // Past the last KV write only the rows the outputs read matter (decoder.h).
        keep_output_rows(rows, a, x);
      }
      x = L.wo(a, {.residual = x});
      if (L.wo_bias) x = mx::add(x, *L.wo_bias);
      mx::array h = L.gate_up(x, {.rms_norm_weight = L.ffn_norm, .eps = dims_.rms_eps, .swiglu = true});
      x = L.down(h, {.residual = x});
      if (device_.on_device()) start_layer(x);
    }
    compute_outputs(x, rows, lm_head_, out_norm_, dims_.rms_eps, 0.f, logits, hidden, build_timer);
  }

  DeviceState& device_state() override { return device_; }

 private:
  // QK-norm: RMSNorm of every q and k head (not v) before attention rotates them.
  mx::array norm_qk(const mx::array& qkv, const Layer& L) const {
    const int rows = qkv.shape(0), hd = dims_.head_dim;
    const int qw = dims_.n_heads * hd, kw = dims_.n_kv_heads * hd;
    mx::array q = mx::slice(qkv, {0, 0}, {rows, qw});
    mx::array k = mx::slice(qkv, {0, qw}, {rows, qw + kw});
    mx::array v = mx::slice(qkv, {0, qw + kw}, {rows, qw + 2 * kw});
    return mx::concatenate({head_rms_norm(q, L.q_norm, dims_.n_heads, hd, dims_.rms_eps, device_.on_device()),
                            head_rms_norm(k, L.k_norm, dims_.n_kv_heads, hd, dims_.rms_eps, device_.on_device()), v},
                           1);
  }

  DecoderDims dims_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  mx::array out_norm_;
  Linear lm_head_;
  Embedding embed_;
  std::shared_ptr<const Rope> rope_;
  DeviceState device_;
};

std::optional<mx::array> gguf_vector(const GgufFile& file, const std::string& name) {
  const TensorView* t = file.find(name);
  if (!t) return std::nullopt;
  return dequantize_tensor(*t);
}

}  // namespace

std::unique_ptr<Model> load_llama_family_gguf(const GgufFile& file, const LoadOptions& options,
                                              const LlamaVariant& variant) {
  const Metadata& m = file.metadata();
  const std::string p = variant.arch + ".";
  DecoderDims c;
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
  c.check(variant.arch);

  auto rope = std::make_shared<Rope>();
  rope->dims = static_cast<int>(m.get_int(p + "rope.dimension_count").value_or(c.head_dim));
  rope->interleaved = variant.gguf_interleaved_rope;
  std::vector<float> factors;
  if (const TensorView* f = file.find("rope_freqs.weight")) {
    factors.resize(f->n_elements());
    dequantize_row(f->type, f->data, factors.data(), f->n_elements());
  }
  rope->inv_freq = rope_inv_freq(rope->dims, m.get_float(p + "rope.freq_base").value_or(10000.0), factors);
  const std::string scaling = m.get_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const double factor = m.get_float(p + "rope.scaling.factor").value_or(1.0);
    for (float& f : rope->inv_freq) f = static_cast<float>(f / factor);
  } else if (scaling != "none") {
    throw std::runtime_error(variant.arch + " rope scaling type '" + scaling + "' is not supported yet");
  }

#ifdef LLMD_WITH_CUDA
  // The cuda backend: the same hyperparameters and RoPE table, llmd's CUDA kernels for the step
  // (native/cuda/cuda_model.h). A pull-time check (validate_only) runs the checks below instead.
  if (options.backend == "cuda" && !options.validate_only) {
    if (file.find("blk.0.attn_output.bias")) {
      throw std::runtime_error("the cuda backend does not run models with an attention output bias yet; use "
                               "--backend gpu or cpu");
    }
    cuda::LlamaConfig cc;
    cc.n_layers = c.n_layers;
    cc.hidden_size = c.hidden_size;
    cc.ffn_size = c.ffn_size;
    cc.n_heads = c.n_heads;
    cc.n_kv_heads = c.n_kv_heads;
    cc.head_dim = c.head_dim;
    cc.vocab_size = c.vocab_size;
    cc.context_length = options.context_length > 0 ? options.context_length : c.context_length;
    cc.rms_eps = c.rms_eps;
    cc.rope_inv_freq = rope->inv_freq;
    cc.rope_dims = rope->dims;
    cc.rope_interleaved = rope->interleaved;
    cc.qkv_bias = variant.requires_qkv_bias || file.find("blk.0.attn_q.bias") != nullptr;
    cc.qk_norm = variant.qk_norm;
    ModelInfo info = make_info(c, variant.arch, "gguf:" + type_name(file.tensor("blk.0.ffn_down.weight").type), options);
    info.weight_bytes = file.file_size();
    return cuda::load_llama(file, cc, std::move(info));
  }
#endif
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
    L.qkv = Linear::from_gguf({q, k, v}, false, dev);
    if (variant.requires_qkv_bias || file.find(b + "attn_q.bias")) {
      L.qkv_bias = mx::concatenate({dequantize_tensor(file.tensor(b + "attn_q.bias")),
                                    dequantize_tensor(file.tensor(b + "attn_k.bias")),
                                    dequantize_tensor(file.tensor(b + "attn_v.bias"))});
      L.qkv_bias->eval();
    }
    if (variant.qk_norm) {
      L.q_norm = dequantize_tensor(file.tensor(b + "attn_q_norm.weight"));
      L.k_norm = dequantize_tensor(file.tensor(b + "attn_k_norm.weight"));
    }
    L.wo = Linear::from_gguf({&file.tensor(b + "attn_output.weight")}, false, dev);
    L.wo_bias = gguf_vector(file, b + "attn_output.bias");
    const TensorView* gate = &file.tensor(b + "ffn_gate.weight");
    const TensorView* up = &file.tensor(b + "ffn_up.weight");
    L.gate_up = Linear::from_gguf({gate, up}, /*interleave_pairs=*/true, dev);
    L.down = Linear::from_gguf({&file.tensor(b + "ffn_down.weight")}, false, dev);
  }
  mx::array out_norm = dequantize_tensor(file.tensor("output_norm.weight"));
  const TensorView* output = file.find("output.weight");
  Linear lm_head = Linear::from_gguf({output ? output : &embd}, false, dev);
  // Tied embeddings: the lookup reads the lm_head's rows, so the table is stored once (on the
  // CPU backend; the device backend's lm_head is in another format).
  Embedding embed = (!output && lm_head.quantized() && !dev)
                        ? Embedding::tied_to(lm_head)
                        : Embedding(copy_bytes(embd), embd.type, c.hidden_size);

  const std::string format = "gguf:" + type_name(file.tensor("blk.0.ffn_down.weight").type);
  ModelInfo info = make_info(c, variant.arch, format, options);
  info.weight_bytes = file.file_size();
  return std::make_unique<LlamaModel>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                      rope);
}

std::unique_ptr<Model> load_llama_family_safetensors(const std::string& dir, const Metadata& hf,
                                                     const LoadOptions& options, const LlamaVariant& variant) {
  const Checkpoint w(dir, &hf);
  DecoderDims c;
  c.n_layers = static_cast<int>(hf.require_int("num_hidden_layers"));
  c.hidden_size = static_cast<int>(hf.require_int("hidden_size"));
  c.ffn_size = static_cast<int>(hf.require_int("intermediate_size"));
  c.n_heads = static_cast<int>(hf.require_int("num_attention_heads"));
  c.n_kv_heads = static_cast<int>(hf.get_int("num_key_value_heads").value_or(c.n_heads));
  c.head_dim = static_cast<int>(hf.get_int("head_dim").value_or(c.hidden_size / c.n_heads));
  c.rms_eps = static_cast<float>(hf.get_float("rms_norm_eps").value_or(1e-5));
  c.context_length = static_cast<int>(hf.get_int("max_position_embeddings").value_or(4096));
  c.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  c.check(variant.arch);
  if (hf.get_bool("use_sliding_window").value_or(false)) {
    throw std::runtime_error(variant.arch + " with use_sliding_window is not supported yet");
  }

  auto rope = std::make_shared<Rope>();
  rope->dims = c.head_dim;
  rope->interleaved = false;  // Hugging Face layout rotates halves
  const double theta = hf_rope_theta(hf, 10000.0);
  const auto [rope_type, rope_factor] = hf_rope_scaling(hf);
  std::vector<float> factors;
  if (rope_type == "llama3") {
    const std::string s = hf.has("rope_parameters.factor") ? "rope_parameters." : "rope_scaling.";
    factors = llama3_rope_factors(c.head_dim, theta, rope_factor, hf.get_float(s + "low_freq_factor").value_or(1.0),
                                  hf.get_float(s + "high_freq_factor").value_or(4.0),
                                  static_cast<int>(hf.get_int(s + "original_max_position_embeddings").value_or(8192)));
  } else if (!rope_type.empty() && rope_type != "linear") {
    throw std::runtime_error("rope scaling type '" + rope_type + "' is not supported yet");
  }
  rope->inv_freq = rope_inv_freq(rope->dims, theta, factors);
  if (rope_type == "linear") {
    for (float& f : rope->inv_freq) f = static_cast<float>(f / rope_factor);
  }

  const bool dev = options.on_device();
  // A checkpoint saved from the bare decoder (sentence-transformers' Qwen3-Embedding: a
  // Qwen3Model, no lm_head) names its tensors without the "model." prefix.
  const std::string root = w.has("model.embed_tokens.weight") || !w.has("embed_tokens.weight") ? "model." : "";
  std::vector<Layer> layers(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string b = root + "layers." + std::to_string(i) + ".";
    const std::string a = b + "self_attn.";
    Layer& L = layers[i];
    L.attn_norm = w.get(b + "input_layernorm.weight");
    L.ffn_norm = w.get(b + "post_attention_layernorm.weight");
    L.qkv = w.linear({a + "q_proj", a + "k_proj", a + "v_proj"}, dev);
    if (variant.requires_qkv_bias || w.has(a + "q_proj.bias")) {
      L.qkv_bias = mx::concatenate({w.get(a + "q_proj.bias"), w.get(a + "k_proj.bias"), w.get(a + "v_proj.bias")});
      L.qkv_bias->eval();
    }
    if (variant.qk_norm) {
      L.q_norm = w.get(a + "q_norm.weight");
      L.k_norm = w.get(a + "k_norm.weight");
      mx::eval({*L.q_norm, *L.k_norm});
    }
    L.wo = w.linear({a + "o_proj"}, dev);
    L.wo_bias = w.find(a + "o_proj.bias");
    // Interleaved only where llmd's kernels fuse the SwiGLU (a quantized CPU weight).
    L.gate_up = w.linear({b + "mlp.gate_proj", b + "mlp.up_proj"}, dev, /*interleave_pairs=*/true);
    L.down = w.linear({b + "mlp.down_proj"}, dev);
    mx::eval({L.attn_norm, L.ffn_norm});
    if (L.wo_bias) L.wo_bias->eval();
  }
  mx::array out_norm = w.get(root + "norm.weight");
  // No lm_head at all (an embedding model's checkpoint): the tied table stands in, so the
  // model still loads and warms up; its embeddings never read it.
  const bool tied = !w.has("lm_head.weight") || hf.get_bool("tie_word_embeddings").value_or(false);
  Linear lm_head = w.linear({tied ? root + "embed_tokens" : "lm_head"}, dev);
  Embedding embed = w.embedding(root + "embed_tokens", tied ? &lm_head : nullptr);
  out_norm.eval();
  ModelInfo info = make_info(c, variant.arch, w.format(), options);
  info.weight_bytes = decoder_weight_bytes(layers, lm_head, embed);
  return std::make_unique<LlamaModel>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                      rope);
}

std::unique_ptr<Model> load_llama_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_llama_family_gguf(file, options, LlamaVariant{});
}

std::unique_ptr<Model> load_llama_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  return load_llama_family_safetensors(dir, hf, options, LlamaVariant{});
}

}  // namespace llmd
