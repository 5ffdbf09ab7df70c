// Gemma 3 text decoder (Hugging Face `gemma3_text` / Gemma3ForCausalLM, the text half of
// `gemma3`, and GGUF `gemma3`): embeddings scaled by sqrt(hidden); RMSNorm as x * (1 + w)
// (llama.cpp's converter stores 1 + w); sandwich norms around attention and the MLP; a
// GELU-tanh gated MLP; QK-norm; queries scaled by query_pre_attn_scalar^-0.5; sliding-window
// layers (their own RoPE base, no scaling) interleaved with global ones (the config's RoPE base
// and scaling); optional final logit soft-capping.
//
// Sliding layers attend to the last `sliding_window` positions only and keep only that window
// of KV (the pool's window parts, kv_cache.h), so their memory does not grow with the context.
//
// EmbeddingGemma (`use_bidirectional_attention`: a Gemma3TextModel that embeds) attends both
// ways: global layers see the whole prompt, sliding layers the positions fewer than
// sliding_window / 2 + 1 away on either side (transformers halves the configured window for
// it). Such a model is bidirectional() (the engine feeds whole prompts, never from the prefix
// cache), keeps no KV and only pools hidden states; its sentence-transformers pooling, Dense
// and Normalize modules are applied by the engine and the worker (store/dense_modules.py).
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

#include "../core/op_profile.h"
#include "architectures.h"
#include "compiled_ops.h"
#include "decoder.h"

namespace llmd {

namespace {

struct Gemma3Config {
  DecoderDims dims;
  float query_scale = 0.f;  // query_pre_attn_scalar^-0.5
  int sliding_window = 0;   // 0: no sliding layers
  std::vector<bool> sliding;
  float final_softcap = 0.f;
  bool bidirectional = false;  // EmbeddingGemma: sliding_window is then the halved one
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
  return gelu_tanh_mul(g, u);  // one compiled node (compiled_ops.h)
}

// Bidirectional attention over one prompt's rows: q [n, heads * hd], k and v [n, kv_heads * hd]
// (already rotated) -> [n, heads * hd]. With `window` > 0, row i sees row j only where
// |i - j| < window (transformers' bidirectional sliding window). Explicit ops, as
// device_attention.cpp's attend(): MLX's fused attention takes cuDNN's path on CUDA, which
// fails on the engine's thread.
mx::array bidirectional_attention(const mx::array& q, const mx::array& k, const mx::array& v, int heads, int kv_heads,
                                  int hd, float scale, int window) {
  const int n = q.shape(0), rep = heads / kv_heads;
  // Query head h reads KV head h / rep: group the queries by their KV head, [kv_heads, rep * n, hd].
  mx::array qh = mx::transpose(mx::reshape(q, {n, kv_heads, rep, hd}), {1, 2, 0, 3});
  qh = mx::reshape(qh, {kv_heads, rep * n, hd});
  mx::array kh = mx::transpose(mx::reshape(k, {n, kv_heads, hd}), {1, 2, 0});  // [kv_heads, hd, n]
  mx::array vh = mx::transpose(mx::reshape(v, {n, kv_heads, hd}), {1, 0, 2});  // [kv_heads, n, hd]
  mx::array s = mx::multiply(mx::astype(mx::matmul(qh, kh), mx::float32), mx::array(scale));
  if (window > 0 && n > window) {
    const mx::array i = mx::expand_dims(mx::arange(n, mx::int32), 1);
    const mx::array j = mx::expand_dims(mx::arange(n, mx::int32), 0);
    const mx::array seen = mx::less(mx::abs(mx::subtract(i, j)), mx::array(window));  // [n, n]
    const mx::array neg_inf(-std::numeric_limits<float>::infinity());
    s = mx::reshape(mx::where(seen, mx::reshape(s, {kv_heads, rep, n, n}), neg_inf), {kv_heads, rep * n, n});
  }
  mx::array p = mx::astype(mx::softmax(s, -1, /*precise=*/true), v.dtype());
  mx::array o = mx::matmul(p, vh);  // [kv_heads, rep * n, hd]
  return mx::reshape(mx::transpose(mx::reshape(o, {kv_heads, rep, n, hd}), {2, 0, 1, 3}), {n, heads * hd});
}

// A Rope's frequencies as mx::fast::rope takes them: periods (1 / inv_freq).
mx::array rope_periods(const Rope& rope) {
  std::vector<float> periods(rope.inv_freq.size());
  for (size_t i = 0; i < periods.size(); ++i) periods[i] = 1.f / rope.inv_freq[i];
  return mx::array(periods.begin(), {static_cast<int>(periods.size())}, mx::float32);
}

class Gemma3Model : public DeviceStateModel {
 public:
  Gemma3Model(Gemma3Config cfg, ModelInfo info, std::vector<Layer> layers, mx::array out_norm, Linear lm_head,
              Embedding embed, std::shared_ptr<const Rope> global_rope, std::shared_ptr<const Rope> local_rope)
      : cfg_(std::move(cfg)), info_(std::move(info)), layers_(std::move(layers)), out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)), embed_(std::move(embed)), global_rope_(std::move(global_rope)),
        local_rope_(std::move(local_rope)), global_periods_(rope_periods(*global_rope_)),
        local_periods_(rope_periods(*local_rope_)), device_(lm_head_.on_device()) {}

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }
  KvShape kv_shape() const override {
    // A bidirectional model keeps no KV: a one-element shape without host storage gives the
    // engine's per-sequence bookkeeping something to count and allocates nothing (as bert.cpp).
    if (cfg_.bidirectional) return KvShape{.n_layers = 1, .n_kv_heads = 1, .head_dim = 1, .host_storage = false};
    // Sliding layers keep only their window of KV (kv_cache.h, "Window parts").
    KvShape shape = decoder_kv_shape(cfg_.dims, device_.on_device());
    shape.window = cfg_.sliding_window;
    shape.windowed = cfg_.sliding;
    return shape;
  }

  std::map<std::string, uint64_t> attention_paths() const override { return device_.attention_paths(); }
  // Images (siglip.cpp's rows): both backends' attention honour their bidirectional rows.
  bool accepts_embeddings() const override { return !cfg_.bidirectional; }
  bool bidirectional() const override { return cfg_.bidirectional; }
  // Pooled hidden states: EmbeddingGemma only (a causal Gemma 3 is no embedding model; the pull
  // refuses one with a Pooling module, model_kind.py).
  bool supports_hidden() const override { return cfg_.bidirectional; }
  bool samples_on_device() const override { return device_.on_device(); }

  std::map<std::string, std::string> matmul_paths() const override {
    return decoder_matmul_paths(layers_, lm_head_);
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::vector<float> unused;
    forward(step, pool, logits, unused);
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits, std::vector<float>& hidden) override {
    if (cfg_.bidirectional) {
      forward_bidirectional(step, logits, hidden);
      return;
    }
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const DecoderDims& d = cfg_.dims;
    StepRows rows = embed_step(step, pool, embed_, d.hidden_size, std::sqrt(static_cast<float>(d.hidden_size)));
    rows.batch->counts = device_.path_counts();
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
      local_plan = DeviceAttentionPlan::build(*local, *local_rope_, device_kv, &*global_plan);
    }
    const int hd = d.head_dim, qw = d.n_heads * hd, kw = d.n_kv_heads * hd;
    // The post-norms: compiled on the device path (compiled_ops.h), MLX's op on the host backend.
    auto post_norm = [&](const mx::array& v, const mx::array& w) {
      return device_kv ? rms_norm(v, w, d.rms_eps) : mx::fast::rms_norm(v, w, d.rms_eps);
    };
    mx::array x(rows.x.begin(), {rows.total, d.hidden_size}, mx::float32);
    for (int l = 0; l < d.n_layers; ++l) {
      const Layer& L = layers_[l];
      const bool sliding = cfg_.sliding[l];
      mx::array qkv = L.qkv(x, {.rms_norm_weight = L.attn_norm, .eps = d.rms_eps});
      const int T = rows.total;
      const bool dev = device_kv != nullptr;
      mx::array q = head_rms_norm(mx::slice(qkv, {0, 0}, {T, qw}), L.q_norm, d.n_heads, hd, d.rms_eps, dev);
      mx::array k = head_rms_norm(mx::slice(qkv, {0, qw}, {T, qw + kw}), L.k_norm, d.n_kv_heads, hd, d.rms_eps, dev);
      qkv = mx::concatenate({q, k, mx::slice(qkv, {0, qw + kw}, {T, qw + 2 * kw})}, 1);
      const auto& rope = sliding ? local_rope_ : global_rope_;
      mx::array a{0.f};
      if (device_kv) {
        a = device_attention(qkv, sliding ? *local_plan : *global_plan, l, ashape, *rope, *device_kv);
      } else {
        a = paged_attention(qkv, sliding ? local : global, l, ashape, rope);
      }
      if (l == d.n_layers - 1 && device_kv) {
        // Past the last KV write only the rows the outputs read matter (decoder.h).
        keep_output_rows(rows, a, x);
      }
      x = mx::add(x, post_norm(L.wo(a), L.post_attn_norm));
      mx::array h = gelu_tanh_glu(L.gate_up(x, {.rms_norm_weight = L.ffn_norm, .eps = d.rms_eps}), d.ffn_size);
      x = mx::add(x, post_norm(L.down(h), L.post_ffn_norm));
      if (device_kv) start_layer(x);
    }
    compute_outputs(x, rows, lm_head_, out_norm_, d.rms_eps, cfg_.final_softcap, logits, hidden, build_timer);
  }

  DeviceState& device_state() override { return device_; }

 private:
  // EmbeddingGemma: each segment a whole prompt (the engine feeds a bidirectional() model
  // so), its rows attending to one another, no KV read or written; returns the pooled
  // final-norm rows the segments ask for.
  void forward_bidirectional(const Step& step, std::vector<float>& logits, std::vector<float>& hidden) {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const DecoderDims& d = cfg_.dims;
    std::vector<int32_t> tokens, positions;
    std::vector<std::pair<int, int>> spans;  // (first row, rows) of each segment
    for (const StepSegment& s : step.segments) {
      if (s.want_logits) {
        throw std::runtime_error(
            "gemma3 with bidirectional attention is an embedding model: it has no next-token logits");
      }
      if (s.start_pos != 0 || !s.embeddings.empty()) {
        throw std::runtime_error("gemma3 with bidirectional attention runs whole text prompts only");
      }
      spans.emplace_back(static_cast<int>(tokens.size()), static_cast<int>(s.tokens.size()));
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        tokens.push_back(s.tokens[i]);
        positions.push_back(static_cast<int32_t>(i));
      }
    }
    const int T = static_cast<int>(tokens.size()), H = d.hidden_size, hd = d.head_dim;
    const int qw = d.n_heads * hd, kw = d.n_kv_heads * hd;
    std::vector<float> rows(static_cast<size_t>(T) * H);
    embed_.lookup(tokens, rows.data(), std::sqrt(static_cast<float>(H)));
    mx::array x(rows.begin(), {T, H}, mx::float32);
    const mx::array pos(positions.begin(), {T}, mx::int32);
    // Each row rotated at its position within its own prompt; rows [T, heads, 1, hd].
    auto rotate = [&](const mx::array& a, int heads, bool sliding) {
      const Rope& rope = sliding ? *local_rope_ : *global_rope_;
      mx::array r = mx::fast::rope(mx::reshape(a, {T, heads, 1, hd}), rope.dims, rope.interleaved, std::nullopt, 1.f,
                                   pos, sliding ? local_periods_ : global_periods_);
      return mx::reshape(r, {T, heads * hd});
    };
    for (int l = 0; l < d.n_layers; ++l) {
      const Layer& L = layers_[l];
      const bool sliding = cfg_.sliding[l];
      mx::array qkv = L.qkv(x, {.rms_norm_weight = L.attn_norm, .eps = d.rms_eps});
      const bool dev = device_.on_device();
      const mx::array q_normed = head_rms_norm(mx::slice(qkv, {0, 0}, {T, qw}), L.q_norm, d.n_heads, hd, d.rms_eps, dev);
      const mx::array k_normed =
          head_rms_norm(mx::slice(qkv, {0, qw}, {T, qw + kw}), L.k_norm, d.n_kv_heads, hd, d.rms_eps, dev);
      mx::array q = rotate(q_normed, d.n_heads, sliding);
      mx::array k = rotate(k_normed, d.n_kv_heads, sliding);
      mx::array v = mx::slice(qkv, {0, qw + kw}, {T, qw + 2 * kw});
      std::vector<mx::array> outs;
      for (const auto& [first, n] : spans) {
        auto part = [&, first = first, n = n](const mx::array& a) {
          return mx::slice(a, {first, 0}, {first + n, a.shape(1)});
        };
        outs.push_back(bidirectional_attention(part(q), part(k), part(v), d.n_heads, d.n_kv_heads, hd,
                                               cfg_.query_scale, sliding ? cfg_.sliding_window : 0));
      }
      mx::array a = outs.size() == 1 ? outs[0] : mx::concatenate(outs, 0);
      x = mx::add(x, mx::fast::rms_norm(L.wo(a), L.post_attn_norm, d.rms_eps));
      mx::array h = gelu_tanh_glu(L.gate_up(x, {.rms_norm_weight = L.ffn_norm, .eps = d.rms_eps}), d.ffn_size);
      x = mx::add(x, mx::fast::rms_norm(L.down(h), L.post_ffn_norm, d.rms_eps));
      if (device_.on_device()) start_layer(x);
    }
    // The pooled rows after the final norm, float32 (as sentence-transformers pools), one per
    // segment that asked: the sum over its rows (mean pooling: the engine divides), its last
    // row or its first.
    std::vector<mx::array> pooled;
    for (size_t i = 0; i < step.segments.size(); ++i) {
      const HiddenOut mode = step.segments[i].hidden;
      if (mode == HiddenOut::None) continue;
      const auto [first, n] = spans[i];
      const int from = mode == HiddenOut::Last ? first + n - 1 : first;
      const int to = mode == HiddenOut::Sum ? first + n : from + 1;
      mx::array h = mx::fast::rms_norm(mx::astype(mx::slice(x, {from, 0}, {to, H}), mx::float32), out_norm_, d.rms_eps);
      pooled.push_back(mode == HiddenOut::Sum ? mx::sum(h, 0, true) : h);
    }
    build_timer.reset();
    logits.clear();
    hidden.clear();
    if (pooled.empty()) return;  // nothing asked for: nothing worth evaluating
    mx::array out = pooled.size() == 1 ? pooled[0] : mx::concatenate(pooled, 0);
    out.eval();
    hidden.assign(out.data<float>(), out.data<float>() + out.size());
  }

  Gemma3Config cfg_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  mx::array out_norm_;
  Linear lm_head_;
  Embedding embed_;
  std::shared_ptr<const Rope> global_rope_;
  std::shared_ptr<const Rope> local_rope_;
  mx::array global_periods_;  // the ropes' frequencies for mx::fast::rope (the bidirectional path)
  mx::array local_periods_;
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
  c.bidirectional = hf.get_bool("use_bidirectional_attention").value_or(false);
  require_gelu_tanh(hf, "gemma3");
  c.sliding_window = static_cast<int>(hf.get_int("sliding_window").value_or(4096));
  // transformers' Gemma3TextConfig: a bidirectional model's window is half the stored one plus
  // one, an exclusive bound on the distance either way (row i sees j where |i - j| < window).
  if (c.bidirectional) c.sliding_window = c.sliding_window / 2 + 1;
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

  // Text-only checkpoints name the decoder `model.`; multimodal ones nest it; a bare
  // Gemma3TextModel saved by sentence-transformers (EmbeddingGemma) has no prefix.
  std::string m = "model.";
  for (const char* prefix : {"model.", "language_model.model.", "model.language_model.", ""}) {
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
