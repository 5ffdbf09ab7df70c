// Gemma 4 text decoder (Hugging Face `gemma4_text` / Gemma4ForCausalLM, the text half of the
// multimodal `gemma4` / Gemma4ForConditionalGeneration), as transformers 5.23 defines it:
// - embeddings scaled by sqrt(hidden); RMSNorm as x * w (not Gemma 3's 1 + w); sandwich norms
//   around attention and the MLP; a GELU-tanh gated MLP; each layer's output times a stored
//   `layer_scalar`; optional final logit soft-capping.
// - attention with scale 1 (QK-norm does the scaling), values RMS-normalised without a weight;
//   sliding-window layers (head_dim, num_key_value_heads, their own RoPE) and full layers with
//   their own head size and KV-head count (global_head_dim / num_global_key_value_heads, or
//   a transformers-5.23 `per_layer_config`), full layers optionally with keys = values
//   (attention_k_eq_v: no v_proj) and "proportional" RoPE (only the first
//   partial_rotary_factor of the frequencies rotate).
// - per-layer input embeddings (PLE): a second token table [vocab, layers * P] plus a projection
//   of the embeddings, combined per layer into a gated residual after the MLP.
// - KV sharing: the last num_kv_shared_layers layers store no KV and attend over the KV of the
//   last earlier layer of their own type (its keys are rotated with the same RoPE); with
//   use_double_wide_mlp their MLP is twice as wide.
// - an optional MoE block in every layer (enable_moe_block): a router (weightless RMSNorm, a
//   per-feature scale, softmax, top-k, renormalised, times a per-expert scale) over experts
//   stored as [E, 2I, H] / [E, H, I] tensors, its output normed and added to the dense MLP's.
//
// Every layer's KV has the layer's own shape in the pool (KvShape per-layer entries); sliding
// layers keep only their window of KV, as Gemma 3's do (the pool's window parts). GGUF Gemma 4
// files are refused (load_gemma4_gguf).
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "../core/op_profile.h"
#include "architectures.h"
#include "compiled_ops.h"
#include "decoder.h"

namespace llmd {

namespace {

struct Gemma4Config {
  DecoderDims dims;  // n_kv_heads / head_dim: the sliding layers'
  int global_head_dim = 0;
  int global_kv_heads = 0;
  int sliding_window = 0;
  std::vector<bool> sliding;
  std::vector<int> kv_source;  // the layer whose KV each layer attends over (itself unless shared)
  bool k_eq_v = false;         // full layers: values are the key projection
  int ple_dim = 0;             // hidden_size_per_layer_input (0: no per-layer inputs)
  int ple_vocab = 0;
  bool double_wide_mlp = false;
  bool moe = false;
  int n_experts = 0;
  int top_k = 0;
  int moe_ffn = 0;
  float final_softcap = 0.f;
  // Images: the token whose per-layer embedding image rows take (transformers looks the
  // multimodal rows up as pad_token_id), and whether an image's rows see the whole image on
  // the sliding layers (use_bidirectional_attention "vision"; full layers stay causal).
  int pad_token = 0;
  bool image_bidirectional = false;

  int head_dim(int l) const { return sliding[l] ? dims.head_dim : global_head_dim; }
  int kv_heads(int l) const { return sliding[l] ? dims.n_kv_heads : global_kv_heads; }
  bool shared(int l) const { return kv_source[l] != l; }
};

struct Layer {
  mx::array attn_norm{0.f};
  mx::array q_norm{0.f};
  mx::array k_norm{0.f};
  mx::array post_attn_norm{0.f};
  mx::array ffn_norm{0.f};
  mx::array post_ffn_norm{0.f};
  mx::array scalar{1.f};
  Linear qkv;  // q | k | v; q | k with keys = values; q only in a KV-shared layer
  Linear wo;
  Linear gate_up;  // gate rows then up rows
  Linear down;
  int ffn = 0;
  // Per-layer input.
  Linear ple_gate;
  Linear ple_proj;
  mx::array ple_norm{0.f};
  // MoE block.
  Linear router;
  mx::array router_norm{0.f};       // router.scale * hidden^-0.5 (after a weightless RMSNorm)
  mx::array expert_scale{0.f};      // [E] per_expert_scale
  mx::array experts_gate_up{0.f};   // [E, H, 2I]
  mx::array experts_down{0.f};      // [E, I, H]
  // MLX-quantized experts (mlx-lm's switch_glu), run by gather_qmm: experts_gate_up
  // [E, 2I, packed H] (gate rows then up rows), experts_down [E, H, packed I].
  int expert_bits = 0, expert_group = 0;
  mx::array gu_scales{0.f}, gu_biases{0.f}, dn_scales{0.f}, dn_biases{0.f};
  mx::array post_ffn_norm_1{0.f};
  mx::array pre_ffn_norm_2{0.f};
  mx::array post_ffn_norm_2{0.f};
};

// GELU-tanh of the gate half of the last axis times the up half.
mx::array gelu_tanh_glu(const mx::array& gate_up, int ffn) {
  const int axis = gate_up.ndim() - 1;
  mx::Shape lo(gate_up.ndim(), 0), mid = gate_up.shape(), hi = gate_up.shape();
  mid[axis] = ffn;
  mx::array g = mx::slice(gate_up, lo, mid);
  lo[axis] = ffn;
  mx::array u = mx::slice(gate_up, lo, hi);
  return gelu_tanh_mul(g, u);  // one compiled node (compiled_ops.h)
}

class Gemma4Model : public DeviceStateModel {
 public:
  Gemma4Model(Gemma4Config cfg, ModelInfo info, std::vector<Layer> layers, mx::array out_norm, Linear lm_head,
              Embedding embed, Embedding ple_embed, Linear ple_model_proj, mx::array ple_proj_norm,
              std::shared_ptr<const Rope> global_rope, std::shared_ptr<const Rope> local_rope, bool on_device)
      : cfg_(std::move(cfg)), info_(std::move(info)), layers_(std::move(layers)), out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)), embed_(std::move(embed)), ple_embed_(std::move(ple_embed)),
        ple_model_proj_(std::move(ple_model_proj)), ple_proj_norm_(std::move(ple_proj_norm)),
        global_rope_(std::move(global_rope)), local_rope_(std::move(local_rope)), device_(on_device) {}

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }

  KvShape kv_shape() const override {
    KvShape s = decoder_kv_shape(cfg_.dims, device_.on_device());
    for (int l = 0; l < cfg_.dims.n_layers; ++l) {
      s.layer_kv_heads.push_back(cfg_.shared(l) ? 0 : cfg_.kv_heads(l));
      s.layer_head_dim.push_back(cfg_.head_dim(l));
    }
    // Sliding layers (and the shared ones reading them) keep only their window of KV.
    s.window = cfg_.sliding_window;
    s.windowed = cfg_.sliding;
    return s;
  }

  std::map<std::string, uint64_t> attention_paths() const override { return device_.attention_paths(); }
  bool samples_on_device() const override { return device_.on_device(); }

  // Images (gemma4_vision.cpp's rows): both backends' attention honour their bidirectional rows.
  bool accepts_embeddings() const override { return true; }

  std::map<std::string, std::string> matmul_paths() const override {
    std::map<std::string, std::string> paths = decoder_matmul_paths(layers_, lm_head_);
    if (cfg_.ple_dim > 0) paths["per_layer_model_proj"] = ple_model_proj_.path();
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      if (cfg_.ple_dim > 0) {
        paths["blk." + std::to_string(i) + ".inp_gate"] = L.ple_gate.path();
        paths["blk." + std::to_string(i) + ".proj"] = L.ple_proj.path();
      }
      if (!cfg_.moe) continue;
      const std::string dev = mx::default_device() == mx::Device::gpu ? "gpu" : "cpu";
      const std::string p = "blk." + std::to_string(i) + ".";
      paths[p + "ffn_gate_inp"] = L.router.path();
      paths[p + "ffn_gate_up_exps"] = paths[p + "ffn_down_exps"] =
          L.expert_bits ? "mlx:gather_qmm:affine" + std::to_string(L.expert_bits) + "g" +
                              std::to_string(L.expert_group) + ":" + dev
                        : std::string("mlx:gather_mm:") + (L.experts_gate_up.dtype() == mx::float32 ? "f32" : "f16") +
                              ":" + dev;
    }
    return paths;
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const DecoderDims& d = cfg_.dims;
    const int H = d.hidden_size;
    StepRows rows = embed_step(step, pool, embed_, H, std::sqrt(static_cast<float>(H)));
    rows.batch->counts = device_.path_counts();
    const int T = rows.total;
    std::shared_ptr<AttentionBatch> global = rows.batch;
    auto local = std::make_shared<AttentionBatch>(*global);
    local->window = cfg_.sliding_window;
    // An image's rows see past themselves only where transformers' mask lets them: on the
    // sliding layers with use_bidirectional_attention "vision", never on the full layers.
    for (auto& seg : global->segments) seg.attend_to.clear();
    if (!cfg_.image_bidirectional) {
      for (auto& seg : local->segments) seg.attend_to.clear();
    }
    if (!device_.on_device()) {  // host cos/sin for the CPU backend; the device path uses mx::fast::rope
      global->build_rope_tables(*global_rope_);
      local->build_rope_tables(*local_rope_);
    }
    std::optional<DeviceAttentionPlan> global_plan, local_plan;
    DeviceKvStore* device_kv = nullptr;
    if (device_.on_device()) {
      device_kv = &device_.prepare(pool, kv_shape());
      global_plan = DeviceAttentionPlan::build(*global, *global_rope_, device_kv);
      local_plan = DeviceAttentionPlan::build(*local, *local_rope_, device_kv, &*global_plan);
    }
    mx::array x(rows.x.begin(), {T, H}, mx::float32);
    std::optional<mx::array> ple = per_layer_inputs(step, x);
    const int P = cfg_.ple_dim;
    // The post-norms: compiled on the device path (compiled_ops.h), MLX's op on the host backend.
    auto post_norm = [&](const mx::array& v, const mx::array& w) {
      return device_kv ? rms_norm(v, w, d.rms_eps) : mx::fast::rms_norm(v, w, d.rms_eps);
    };
    for (int l = 0; l < d.n_layers; ++l) {
      const Layer& L = layers_[l];
      const bool sliding = cfg_.sliding[l];
      const bool shared = cfg_.shared(l);
      const int hd = cfg_.head_dim(l), kvh = cfg_.kv_heads(l);
      const int qw = d.n_heads * hd, kw = kvh * hd;
      mx::array qkv = L.qkv(x, {.rms_norm_weight = L.attn_norm, .eps = d.rms_eps});
      const bool dev = device_kv != nullptr;
      mx::array q = head_rms_norm(mx::slice(qkv, {0, 0}, {T, qw}), L.q_norm, d.n_heads, hd, d.rms_eps, dev);
      if (!shared) {
        mx::array k_raw = mx::slice(qkv, {0, qw}, {T, qw + kw});
        mx::array v_raw = (cfg_.k_eq_v && !sliding) ? k_raw : mx::slice(qkv, {0, qw + kw}, {T, qw + 2 * kw});
        mx::array k = head_rms_norm(k_raw, L.k_norm, kvh, hd, d.rms_eps, dev);
        mx::array v = head_rms_norm(v_raw, std::nullopt, kvh, hd, d.rms_eps, dev);
        q = mx::concatenate({q, k, v}, 1);
      }
      const AttentionShape ashape{d.n_heads, kvh, hd, 1.f};
      const auto& rope = sliding ? local_rope_ : global_rope_;
      const int kv_layer = cfg_.kv_source[l];
      mx::array a{0.f};
      if (device_kv) {
        a = device_attention(q, sliding ? *local_plan : *global_plan, kv_layer, ashape, *rope, *device_kv, !shared);
      } else {
        a = paged_attention(q, sliding ? local : global, kv_layer, ashape, rope, !shared);
      }
      std::optional<mx::array> kept;
      if (l == d.n_layers - 1 && device_kv) {
        // Past the last KV write only the rows the outputs read matter (decoder.h).
        kept = keep_output_rows(rows, a, x);
      }
      x = mx::add(x, post_norm(L.wo(a), L.post_attn_norm));

      mx::array h = L.down(gelu_tanh_glu(L.gate_up(x, {.rms_norm_weight = L.ffn_norm, .eps = d.rms_eps}), L.ffn));
      if (cfg_.moe) {
        h = mx::add(post_norm(h, L.post_ffn_norm_1), post_norm(experts(L, x), L.post_ffn_norm_2));
      }
      x = mx::add(x, post_norm(h, L.post_ffn_norm));
      if (ple) {
        mx::array pl = mx::slice(*ple, {0, l * P}, {T, (l + 1) * P});
        if (kept) pl = mx::take(pl, *kept, 0);
        mx::array g = mx::multiply(gelu_tanh(L.ple_gate(x)), pl);
        x = mx::add(x, post_norm(L.ple_proj(g), L.ple_norm));
      }
      x = mx::multiply(x, L.scalar);
      if (device_kv) start_layer(x);
    }
    std::vector<float> no_hidden;  // Gemma 4 serves no embeddings: only logits or device-sampled tokens
    compute_outputs(x, rows, lm_head_, out_norm_, d.rms_eps, cfg_.final_softcap, logits, no_hidden, build_timer);
  }

  DeviceState& device_state() override { return device_; }

 private:
  // [T, layers * P]: (norm(projection of the embeddings) + the token's per-layer embedding) / sqrt(2).
  std::optional<mx::array> per_layer_inputs(const Step& step, const mx::array& x) const {
    const int P = cfg_.ple_dim;
    if (P == 0) return std::nullopt;
    const int T = x.shape(0), LP = cfg_.dims.n_layers * P;
    std::vector<int32_t> tokens;
    tokens.reserve(T);
    for (const StepSegment& seg : step.segments) {
      for (size_t i = 0; i < seg.tokens.size(); ++i) {
        // Image rows (surrogate ids) take the pad token's per-layer embedding, as transformers'.
        const bool image = !seg.embeddings.empty() && seg.embeddings[i] != nullptr;
        tokens.push_back(image ? cfg_.pad_token : seg.tokens[i]);
      }
    }
    std::vector<float> table(static_cast<size_t>(T) * LP);
    ple_embed_.lookup(tokens, table.data(), std::sqrt(static_cast<float>(P)));
    mx::array tok(table.begin(), {T, LP}, mx::float32);
    const float proj_scale = 1.f / std::sqrt(static_cast<float>(cfg_.dims.hidden_size));
    mx::array proj = mx::multiply(ple_model_proj_(x), mx::array(proj_scale));
    proj = mx::reshape(mx::fast::rms_norm(mx::reshape(proj, {T, cfg_.dims.n_layers, P}), ple_proj_norm_,
                                          cfg_.dims.rms_eps),
                       {T, LP});
    return mx::multiply(mx::add(proj, tok), mx::array(static_cast<float>(1.0 / std::sqrt(2.0))));
  }

  // The MoE block of layer L on the residual stream x [T, H] (before the MLP): every row's
  // top-k experts through MLX's gather matmuls (one [1, H] x [H, n] product per row and expert,
  // so a row's result does not depend on its batch neighbours).
  mx::array experts(const Layer& L, const mx::array& x) const {
    const DecoderDims& d = cfg_.dims;
    const int T = x.shape(0), K = cfg_.top_k;
    // Weightless RMSNorm times router.scale * hidden^-0.5 (folded into the fused norm weight).
    mx::array scores = L.router(x, {.rms_norm_weight = L.router_norm, .eps = d.rms_eps});
    mx::array probs = mx::softmax(mx::astype(scores, mx::float32), -1, /*precise=*/true);
    mx::array idx = mx::slice(mx::argpartition(mx::negative(probs), K - 1, -1), {0, 0}, {T, K});
    mx::array w = mx::take_along_axis(probs, idx, -1);
    w = mx::divide(w, mx::sum(w, -1, /*keepdims=*/true));
    w = mx::multiply(w, mx::take(L.expert_scale, idx, 0));  // [T, K]
    const mx::Dtype dt = L.expert_bits ? L.gu_scales.dtype() : L.experts_gate_up.dtype();
    auto expert_mm = [&](const mx::array& a, const mx::array& wt, const mx::array& scales, const mx::array& biases) {
      if (!L.expert_bits) return mx::gather_mm(a, wt, std::nullopt, idx);
      return mx::gather_qmm(a, wt, scales, biases, std::nullopt, idx, /*transpose=*/true, L.expert_group,
                            L.expert_bits);
    };
    mx::array xe = mx::reshape(mx::astype(mx::fast::rms_norm(x, L.pre_ffn_norm_2, d.rms_eps), dt),
                               {T, 1, 1, d.hidden_size});
    mx::array gu = expert_mm(xe, L.experts_gate_up, L.gu_scales, L.gu_biases);  // [T, K, 1, 2I]
    mx::array h = gelu_tanh_glu(mx::astype(gu, mx::float32), cfg_.moe_ffn);
    mx::array out = expert_mm(mx::astype(h, dt), L.experts_down, L.dn_scales, L.dn_biases);  // [T, K, 1, H]
    out = mx::reshape(mx::astype(out, mx::float32), {T, K, d.hidden_size});
    return mx::sum(mx::multiply(out, mx::expand_dims(w, -1)), 1);
  }

  Gemma4Config cfg_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  mx::array out_norm_;
  Linear lm_head_;
  Embedding embed_;
  Embedding ple_embed_;
  Linear ple_model_proj_;
  mx::array ple_proj_norm_;
  std::shared_ptr<const Rope> global_rope_;
  std::shared_ptr<const Rope> local_rope_;
  DeviceState device_;
};

// One layer type's RoPE: "default" (every frequency of the layer's head size),
// "proportional" (the first partial_rotary_factor of them; the rest are 0, i.e. those features
// pass unrotated) or "linear"; frequencies divided by `factor`.
std::shared_ptr<Rope> make_rope(const Metadata& hf, const std::string& layer_type, int head_dim,
                                const std::string& default_type, double default_theta, double default_partial) {
  const std::string p = "rope_parameters." + layer_type + ".";
  const bool given = hf.has(p + "rope_type") || hf.has(p + "rope_theta");
  std::string type = given ? hf.get_string(p + "rope_type").value_or("default") : default_type;
  const double theta = hf.get_float(p + "rope_theta").value_or(default_theta);
  const double factor = hf.get_float(p + "factor").value_or(1.0);
  const double partial = hf.get_float(p + "partial_rotary_factor").value_or(given ? 1.0 : default_partial);
  auto rope = std::make_shared<Rope>();
  rope->dims = head_dim;
  rope->interleaved = false;  // rotate-half over the whole head
  rope->inv_freq = rope_inv_freq(head_dim, theta);
  if (type == "proportional") {
    const int angles = static_cast<int>(std::floor(partial * head_dim / 2));
    for (int i = angles; i < head_dim / 2; ++i) rope->inv_freq[i] = 0.f;
  } else if (type != "default" && type != "linear") {
    throw std::runtime_error("gemma4 rope type '" + type + "' (" + layer_type + " layers) is not supported");
  }
  if (type != "default") {
    for (float& f : rope->inv_freq) f = static_cast<float>(f / factor);
  }
  return rope;
}

// Full-attention layers' head size and KV heads: a transformers-5.23 config serialises them as
// per_layer_config {"<layer>": {"head_dim": .., "num_key_value_heads": ..}}; released configs
// as global_head_dim (default 512) and num_global_key_value_heads (used only with
// attention_k_eq_v, as transformers does).
void global_attention_shape(const Metadata& hf, Gemma4Config& c) {
  const DecoderDims& d = c.dims;
  c.global_head_dim = static_cast<int>(hf.get_int("global_head_dim").value_or(512));
  c.global_kv_heads = d.n_kv_heads;
  if (c.k_eq_v) {
    if (auto n = hf.get_int("num_global_key_value_heads")) c.global_kv_heads = static_cast<int>(*n);
  }
  std::map<int, std::pair<int, int>> per_layer;  // layer -> (head_dim, kv heads)
  bool any = false;
  const std::string prefix = "per_layer_config.";
  for (const auto& [key, value] : hf.values()) {
    if (key.rfind(prefix, 0) != 0) continue;
    any = true;
    const std::string rest = key.substr(prefix.size());
    const size_t dot = rest.find('.');
    const std::string field = dot == std::string::npos ? "" : rest.substr(dot + 1);
    int layer = -1;
    try {
      layer = std::stoi(rest.substr(0, dot));
    } catch (const std::exception&) {
      throw std::runtime_error("gemma4 per_layer_config key '" + key + "' is not a layer index");
    }
    if (layer < 0 || layer >= d.n_layers) throw std::runtime_error("gemma4 per_layer_config names layer " + key);
    auto& entry = per_layer.try_emplace(layer, d.head_dim, d.n_kv_heads).first->second;
    if (field == "head_dim") {
      entry.first = static_cast<int>(hf.require_int(key));
    } else if (field == "num_key_value_heads") {
      entry.second = static_cast<int>(hf.require_int(key));
    } else {
      throw std::runtime_error("gemma4 per_layer_config field '" + field + "' is not supported");
    }
  }
  if (!any) return;
  // llmd's attention has one shape per layer type: the per-layer entries must say just that.
  bool first = true;
  for (int l = 0; l < d.n_layers; ++l) {
    auto it = per_layer.find(l);
    const auto shape = it == per_layer.end() ? std::make_pair(d.head_dim, d.n_kv_heads) : it->second;
    if (c.sliding[l]) {
      if (shape != std::make_pair(d.head_dim, d.n_kv_heads)) {
        throw std::runtime_error("gemma4 per_layer_config gives sliding layer " + std::to_string(l) +
                                 " its own attention shape (not supported)");
      }
    } else if (first) {
      std::tie(c.global_head_dim, c.global_kv_heads) = shape;
      first = false;
    } else if (shape != std::make_pair(c.global_head_dim, c.global_kv_heads)) {
      throw std::runtime_error("gemma4 full-attention layers of different shapes are not supported");
    }
  }
}

void check(const Gemma4Config& c) {
  c.dims.check("gemma4");
  if (c.global_head_dim <= 0 || c.global_head_dim % 16 != 0 || c.global_kv_heads <= 0 ||
      c.dims.n_heads % c.global_kv_heads != 0) {
    throw std::runtime_error("gemma4 full-attention layers' head_dim " + std::to_string(c.global_head_dim) + " / " +
                             std::to_string(c.global_kv_heads) +
                             " KV heads are not supported (head_dim a multiple of 16, heads divisible)");
  }
  if (c.ple_dim > 0 && c.ple_vocab < c.dims.vocab_size) {
    throw std::runtime_error("gemma4 vocab_size_per_layer_input " + std::to_string(c.ple_vocab) +
                             " smaller than the vocabulary is not supported");
  }
  if (c.moe && (c.n_experts <= 0 || c.top_k <= 0 || c.top_k > c.n_experts || c.moe_ffn <= 0)) {
    throw std::runtime_error("gemma4 enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size");
  }
}

}  // namespace

std::unique_ptr<Model> load_gemma4_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  Gemma4Config c;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(hf.require_int("num_hidden_layers"));
  d.hidden_size = static_cast<int>(hf.require_int("hidden_size"));
  d.ffn_size = static_cast<int>(hf.require_int("intermediate_size"));
  d.n_heads = static_cast<int>(hf.require_int("num_attention_heads"));
  d.n_kv_heads = static_cast<int>(hf.get_int("num_key_value_heads").value_or(4));
  d.head_dim = static_cast<int>(hf.get_int("head_dim").value_or(256));
  d.rms_eps = static_cast<float>(hf.get_float("rms_norm_eps").value_or(1e-6));
  d.context_length = static_cast<int>(hf.get_int("max_position_embeddings").value_or(131072));
  d.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  c.final_softcap = static_cast<float>(hf.get_float("final_logit_softcapping").value_or(0.0));
  if (hf.get_bool("attention_bias").value_or(false)) {
    throw std::runtime_error("gemma4 with attention_bias is not supported (Gemma 4 checkpoints have none)");
  }
  const std::string bidir = hf.get_string("use_bidirectional_attention").value_or("");
  if (bidir == "all") {
    throw std::runtime_error("gemma4 with use_bidirectional_attention 'all' (an embedding model) is not supported");
  }
  if (!bidir.empty() && bidir != "vision") {
    throw std::runtime_error("gemma4 use_bidirectional_attention '" + bidir + "' is not supported");
  }
  c.image_bidirectional = bidir == "vision";
  c.pad_token = static_cast<int>(hf.get_int("pad_token_id").value_or(0));
  require_gelu_tanh(hf, "gemma4");
  c.sliding_window = static_cast<int>(hf.get_int("sliding_window").value_or(512));
  c.sliding = hf_sliding_layers(hf, d.n_layers, 6, "gemma4");  // transformers' default 5:1
  c.sliding.back() = false;  // transformers forces the last layer to full attention
  c.k_eq_v = hf.get_bool("attention_k_eq_v").value_or(false);
  global_attention_shape(hf, c);

  // KV sharing: layers from num_hidden_layers - num_kv_shared_layers on read the KV of the
  // last earlier layer of their type (transformers' kv_sharing_modes).
  const int n_shared = static_cast<int>(hf.get_int("num_kv_shared_layers").value_or(0));
  const int first_shared = d.n_layers - n_shared;
  if (n_shared < 0 || first_shared < 1) throw std::runtime_error("gemma4 num_kv_shared_layers is out of range");
  for (int l = 0; l < d.n_layers; ++l) {
    int src = l;
    if (l >= first_shared) {
      src = -1;
      for (int j = first_shared - 1; j >= 0 && src < 0; --j) {
        if (c.sliding[j] == c.sliding[l]) src = j;
      }
      if (src < 0) {
        throw std::runtime_error("gemma4 KV-shared layer " + std::to_string(l) + " has no earlier layer of its type");
      }
    }
    c.kv_source.push_back(src);
  }
  c.double_wide_mlp = hf.get_bool("use_double_wide_mlp").value_or(false);
  c.ple_dim = static_cast<int>(hf.get_int("hidden_size_per_layer_input").value_or(256));
  c.ple_vocab = static_cast<int>(hf.get_int("vocab_size_per_layer_input").value_or(262144));
  c.moe = hf.get_bool("enable_moe_block").value_or(false);
  if (c.moe) {
    c.n_experts = static_cast<int>(hf.get_int("num_experts").value_or(0));
    c.top_k = static_cast<int>(hf.get_int("top_k_experts").value_or(0));
    c.moe_ffn = static_cast<int>(hf.get_int("moe_intermediate_size").value_or(0));
  }
  check(c);

  auto local_rope = make_rope(hf, "sliding_attention", d.head_dim, "default", 10000.0, 1.0);
  auto global_rope = make_rope(hf, "full_attention", c.global_head_dim, "proportional", 1e6, 0.25);

  const Checkpoint w(dir, &hf);
  // Text-only checkpoints name the decoder `model.`; multimodal ones nest it.
  std::string m = "model.";
  for (const char* prefix : {"model.", "model.language_model.", "language_model.model."}) {
    if (w.has(std::string(prefix) + "embed_tokens.weight")) {
      m = prefix;
      break;
    }
  }
  auto vec = [&](const std::string& name) {
    mx::array a = w.get(name);
    a.eval();
    return a;
  };
  const bool dev = options.on_device();
  const mx::Dtype expert_dtype = dev ? device_compute_dtype() : mx::float32;
  std::vector<Layer> layers(d.n_layers);
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string b = m + "layers." + std::to_string(i) + ".";
    const std::string a = b + "self_attn.";
    Layer& L = layers[i];
    L.attn_norm = vec(b + "input_layernorm.weight");
    L.post_attn_norm = vec(b + "post_attention_layernorm.weight");
    L.ffn_norm = vec(b + "pre_feedforward_layernorm.weight");
    L.post_ffn_norm = vec(b + "post_feedforward_layernorm.weight");
    L.q_norm = vec(a + "q_norm.weight");
    if (w.has(b + "layer_scalar")) L.scalar = vec(b + "layer_scalar");
    std::vector<std::string> proj{a + "q_proj"};
    if (!c.shared(i)) {
      L.k_norm = vec(a + "k_norm.weight");
      proj.push_back(a + "k_proj");
      if (!(c.k_eq_v && !c.sliding[i])) proj.push_back(a + "v_proj");
    }
    L.qkv = w.linear(proj, dev);
    L.wo = w.linear({a + "o_proj"}, dev);
    L.ffn = d.ffn_size * (c.double_wide_mlp && c.shared(i) ? 2 : 1);
    L.gate_up = w.linear({b + "mlp.gate_proj", b + "mlp.up_proj"}, dev);
    if (L.gate_up.out_features() != 2 * L.ffn) {
      throw std::runtime_error("gemma4 layer " + std::to_string(i) + " mlp.gate_proj has " +
                               std::to_string(L.gate_up.out_features() / 2) + " rows, expected " +
                               std::to_string(L.ffn));
    }
    L.down = w.linear({b + "mlp.down_proj"}, dev);
    if (c.ple_dim > 0) {
      L.ple_gate = w.linear({b + "per_layer_input_gate"}, dev);
      L.ple_proj = w.linear({b + "per_layer_projection"}, dev);
      L.ple_norm = vec(b + "post_per_layer_input_norm.weight");
    }
    if (c.moe) {
      L.router = w.linear({b + "router.proj"}, dev);
      L.router_norm = mx::multiply(w.get(b + "router.scale"),
                                   mx::array(static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.hidden_size)))));
      L.router_norm.eval();
      L.expert_scale = vec(b + "router.per_expert_scale");
      // mlx-lm splits the experts into switch_glu.{gate,up,down}_proj (quantized or not).
      const std::string sw = b + "experts.switch_glu.";
      auto gq = w.quantized_parts(sw + "gate_proj"), uq = w.quantized_parts(sw + "up_proj"),
           dq = w.quantized_parts(sw + "down_proj");
      const mx::Shape gu_shape{c.n_experts, 2 * c.moe_ffn, d.hidden_size};
      const mx::Shape dn_shape{c.n_experts, d.hidden_size, c.moe_ffn};
      if (gq && uq && dq && w.quantization(sw + "gate_proj")->bits == w.quantization(sw + "down_proj")->bits &&
          w.quantization(sw + "up_proj")->bits == w.quantization(sw + "down_proj")->bits) {
        const auto q = *w.quantization(sw + "down_proj");
        const auto cpu = mx::default_stream(mx::Device::cpu);
        L.expert_bits = q.bits;
        L.expert_group = q.group_size;
        L.experts_gate_up = mx::concatenate({gq->w, uq->w}, 1, cpu);
        L.gu_scales = mx::astype(mx::concatenate({gq->scales, uq->scales}, 1, cpu), expert_dtype, cpu);
        L.gu_biases = mx::astype(mx::concatenate({gq->biases, uq->biases}, 1, cpu), expert_dtype, cpu);
        L.experts_down = mx::contiguous(dq->w, false, cpu);
        L.dn_scales = mx::astype(dq->scales, expert_dtype, cpu);
        L.dn_biases = mx::astype(dq->biases, expert_dtype, cpu);
        if (L.experts_gate_up.shape() != mx::Shape{c.n_experts, 2 * c.moe_ffn, d.hidden_size * q.bits / 32} ||
            L.experts_down.shape() != mx::Shape{c.n_experts, d.hidden_size, c.moe_ffn * q.bits / 32}) {
          throw std::runtime_error("gemma4 layer " + std::to_string(i) + " expert tensors have unexpected shapes");
        }
        mx::eval({L.experts_gate_up, L.gu_scales, L.gu_biases, L.experts_down, L.dn_scales, L.dn_biases});
      } else {
        const bool split = w.has(sw + "gate_proj.weight");
        mx::array gu = split ? mx::concatenate({w.get(sw + "gate_proj.weight"), w.get(sw + "up_proj.weight")}, 1)
                             : w.get(b + "experts.gate_up_proj");
        mx::array dn = split ? w.get(sw + "down_proj.weight") : w.get(b + "experts.down_proj");
        if (gu.shape() != gu_shape || dn.shape() != dn_shape) {
          throw std::runtime_error("gemma4 layer " + std::to_string(i) + " expert tensors have unexpected shapes");
        }
        // [E, out, in] -> [E, in, out]: rows of a step multiply their experts' matrices directly.
        L.experts_gate_up = mx::contiguous(mx::astype(mx::swapaxes(gu, 1, 2), expert_dtype));
        L.experts_down = mx::contiguous(mx::astype(mx::swapaxes(dn, 1, 2), expert_dtype));
        mx::eval({L.experts_gate_up, L.experts_down});
      }
      L.post_ffn_norm_1 = vec(b + "post_feedforward_layernorm_1.weight");
      L.pre_ffn_norm_2 = vec(b + "pre_feedforward_layernorm_2.weight");
      L.post_ffn_norm_2 = vec(b + "post_feedforward_layernorm_2.weight");
    }
  }
  Embedding ple_embed;
  Linear ple_model_proj;
  mx::array ple_proj_norm{0.f};
  if (c.ple_dim > 0 && w.quantization(m + "embed_tokens_per_layer")) {
    ple_embed = w.embedding(m + "embed_tokens_per_layer");
    ple_model_proj = w.linear({m + "per_layer_model_projection"}, dev);
    ple_proj_norm = vec(m + "per_layer_projection_norm.weight");
  } else if (c.ple_dim > 0) {
    mx::array t = w.get(m + "embed_tokens_per_layer.weight");
    if (t.shape(0) != c.ple_vocab || t.shape(1) != d.n_layers * c.ple_dim) {
      throw std::runtime_error("gemma4 embed_tokens_per_layer has an unexpected shape");
    }
    // The table is vocab x layers x P (2.3G numbers for the E2B model): keep it as bf16 when
    // the checkpoint stores bf16 (exact), float32 otherwise.
    mx::array t16 = mx::astype(t, mx::bfloat16);
    if (mx::array_equal(mx::astype(t16, mx::float32), t).item<bool>()) {
      mx::array bytes = mx::view(mx::flatten(t16), mx::uint8);
      bytes.eval();
      ple_embed = Embedding(bytes, TensorType::BF16, t.shape(1));
    } else {
      ple_embed = float_embedding(t);
    }
    ple_model_proj = w.linear({m + "per_layer_model_projection"}, dev);
    ple_proj_norm = vec(m + "per_layer_projection_norm.weight");
  }
  mx::array out_norm = vec(m + "norm.weight");
  std::string head = "lm_head.weight";
  const bool tied = !w.has(head) || hf.get_bool("tie_word_embeddings").value_or(true);  // HF default
  Linear lm_head = w.linear({tied ? m + "embed_tokens" : std::string("lm_head")}, dev);
  Embedding embed = w.embedding(m + "embed_tokens", tied ? &lm_head : nullptr);
  ModelInfo info = make_info(d, "gemma4", w.format(), options);
  return std::make_unique<Gemma4Model>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                       std::move(ple_embed), std::move(ple_model_proj), ple_proj_norm, global_rope,
                                       local_rope, dev);
}

std::unique_ptr<Model> load_gemma4_gguf(const GgufFile&, const LoadOptions&) {
  throw std::runtime_error(
      "gemma4 GGUF files are not supported yet: load the Hugging Face safetensors directory "
      "(config.json + *.safetensors) instead");
}

}  // namespace llmd
