// Gemma 4's vision encoder (Hugging Face Gemma4VisionModel, `model.vision_tower.*`) and its
// multimodal embedder (`model.embed_vision.*`), as transformers 5.23 computes them:
//   patch embedding: pixels in [0, 1] mapped to [-1, 1], each patch's (y, x, channel) values
//     through one linear map (no bias), plus a learned 2-D position: the sum of an x table's
//     row and a y table's row (position_embedding_table [2, size, hidden]);
//   layers: Gemma-style sandwich RMSNorms (x * w) around attention and the MLP; attention
//     within each image (no causal mask) with q and k RMS-normed per head (weights), v
//     RMS-normed without a weight, scale 1, and a 2-D rotary: the first half of each head
//     rotated (rotate-half within that half) by the patch's column, the second half by its row,
//     frequencies theta^(-4i / head_dim); a GELU-tanh gated MLP; every linear map optionally
//     clamped on its input and output (use_clipped_linears: stored bounds);
//   pooler: each pooling_kernel_size x pooling_kernel_size square of patches averaged into one
//     soft token (row by row over the pooled grid), times sqrt(hidden); optionally standardized
//     ((x - std_bias) * std_scale);
//   embedder: a weightless RMSNorm and a linear map into the text hidden size. The rows replace
//     the `<|image|>` token embeddings as they are (the decoder's sqrt(hidden) scaling applies
//     to token embeddings only).
// transformers pads every image's patches to the processor's budget and masks the padding out
// of attention and pooling; the patches here are each image's own, unpadded, so the result is
// the same. The processor's side (resize, patch order, positions, soft-token count) is
// daemon/llmd/text/gemma4_images.py.
#include "gemma4_vision.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include <mlx/mlx.h>

#include "decoder.h"
#include "encoder_ops.h"
#include "vision_tower_common.h"

namespace llmd {

namespace {

struct Gemma4VisionConfig : EncoderSizes {
  // Gemma4VisionConfig's defaults where a config leaves a key out.
  Gemma4VisionConfig() : EncoderSizes{768, 3072, 16, 12} {}
  int kv_heads = 12, head_dim = 64;
  int patch = 16, pool = 3, positions = 10240;  // pixels a side, patches pooled a side, table rows a side
  float eps = 1e-6f;
  double theta = 100.0;
  int patch_values() const { return 3 * patch * patch; }
};

// A Gemma4ClippableLinear: the map, and the bounds its input and output are clamped to when
// the checkpoint stores finite ones.
struct ClippedLinear {
  Linear map;
  std::optional<std::pair<float, float>> in, out;

  mx::array operator()(const mx::array& x) const {
    mx::array y = in ? mx::clip(x, mx::array(in->first), mx::array(in->second)) : x;
    y = map(y);
    return out ? mx::clip(y, mx::array(out->first), mx::array(out->second)) : y;
  }
};

struct Layer {
  mx::array input_norm{0.f}, post_attn_norm{0.f}, pre_ffn_norm{0.f}, post_ffn_norm{0.f};
  mx::array q_norm{0.f}, k_norm{0.f};
  ClippedLinear q, k, v, o, gate, up, down;
};

class Gemma4VisionTower : public TowerBase<Gemma4VisionConfig> {
 public:
  Gemma4VisionTower(Gemma4VisionConfig c, VisionInfo info, Linear patch, mx::array pos_x, mx::array pos_y,
                    std::vector<Layer> layers, std::optional<std::pair<mx::array, mx::array>> standardize,
                    Linear projection, bool on_device)
      : TowerBase(c, std::move(info), on_device), patch_(std::move(patch)), pos_x_(std::move(pos_x)),
        pos_y_(std::move(pos_y)), layers_(std::move(layers)), standardize_(std::move(standardize)),
        projection_(std::move(projection)), inv_freq_(axial_inv_freq(c_.theta, c_.head_dim)) {}

  std::vector<float> encode(const float*, int) const override {
    throw std::invalid_argument("Gemma 4 vision towers read images of any size as patches (encode_patches)");
  }

  std::vector<float> encode_patches(const float* patches, const PatchGrids& grids) const override {
    const int k = c_.pool, D = c_.hidden, H = c_.heads, hd = c_.head_dim, quarter = hd / 4;
    const int N = grid_patches(grids, k, "Gemma 4", "pool", c_.positions);
    if (N == 0) return {};
    prepare_thread();
    // Host-side tables per patch (row-major within each image): its column and row, and the
    // rotary cos/sin of each axis' angles.
    std::vector<int32_t> xs(N), ys(N);
    std::vector<float> cos_x(static_cast<size_t>(N) * quarter), sin_x(cos_x.size()), cos_y(cos_x.size()),
        sin_y(cos_x.size());
    int row0 = 0;
    for (const auto& [t, h, w] : grids) {
      for (int i = 0; i < h * w; ++i) {
        const int r = row0 + i;
        xs[r] = i % w;
        ys[r] = i / w;
        for (int j = 0; j < quarter; ++j) {
          const size_t at = static_cast<size_t>(r) * quarter + j;
          cos_x[at] = static_cast<float>(std::cos(xs[r] * inv_freq_[j]));
          sin_x[at] = static_cast<float>(std::sin(xs[r] * inv_freq_[j]));
          cos_y[at] = static_cast<float>(std::cos(ys[r] * inv_freq_[j]));
          sin_y[at] = static_cast<float>(std::sin(ys[r] * inv_freq_[j]));
        }
      }
      row0 += h * w;
    }
    mx::array x(patches, {N, c_.patch_values()}, mx::float32);
    x = patch_(mx::subtract(mx::multiply(x, mx::array(2.f)), mx::array(1.f)));
    x = mx::add(x, mx::add(mx::take(pos_x_, mx::array(xs.begin(), {N}, mx::int32), 0),
                           mx::take(pos_y_, mx::array(ys.begin(), {N}, mx::int32), 0)));
    const mx::Shape table{N, 1, quarter};
    const mx::array cx(cos_x.begin(), table, mx::float32), sx(sin_x.begin(), table, mx::float32);
    const mx::array cy(cos_y.begin(), table, mx::float32), sy(sin_y.begin(), table, mx::float32);
    // [N, heads, hd]: each half of a head rotated (rotate-half within the half) by its axis.
    auto rotate = [&](const mx::array& t, int heads) {
      auto half = [&](int from, const mx::array& cs, const mx::array& sn) {
        mx::array a = mx::slice(t, {0, 0, from}, {N, heads, from + quarter});
        mx::array b = mx::slice(t, {0, 0, from + quarter}, {N, heads, from + 2 * quarter});
        return mx::concatenate(
            {mx::subtract(mx::multiply(a, cs), mx::multiply(b, sn)), mx::add(mx::multiply(b, cs), mx::multiply(a, sn))},
            2);
      };
      return mx::concatenate({half(0, cx, sx), half(2 * quarter, cy, sy)}, 2);
    };
    std::shared_ptr<const EncoderSpans> spans;
    if (!on_device_) {
      auto s = std::make_shared<EncoderSpans>();
      int at = 0;
      for (const auto& g : grids) {
        s->emplace_back(at, g[1] * g[2]);
        at += g[1] * g[2];
      }
      spans = std::move(s);
    }
    for (const Layer& L : layers_) {
      mx::array y = mx::fast::rms_norm(x, L.input_norm, c_.eps);
      mx::array q = mx::fast::rms_norm(mx::reshape(L.q(y), {N, H, hd}), L.q_norm, c_.eps);
      mx::array kk = mx::fast::rms_norm(mx::reshape(L.k(y), {N, c_.kv_heads, hd}), L.k_norm, c_.eps);
      mx::array v = mx::fast::rms_norm(mx::reshape(L.v(y), {N, c_.kv_heads, hd}), std::nullopt, c_.eps);
      q = rotate(q, H);
      kk = rotate(kk, c_.kv_heads);
      if (c_.kv_heads != H) {  // grouped heads: each K/V head serves H / kv_heads query heads
        kk = mx::repeat(kk, H / c_.kv_heads, 1);
        v = mx::repeat(v, H / c_.kv_heads, 1);
      }
      const bool host = !on_device_ && supports_encoder_attention(hd);
      // Scale 1: q and k come RMS-normed. MLX's SDPA on the device backend, or for head sizes
      // the host kernels do not take.
      mx::array a = host ? host_attention(q, kk, v, spans) : per_image_attention(q, kk, v, grids, 1.f);
      x = mx::add(x, mx::fast::rms_norm(L.o(a), L.post_attn_norm, c_.eps));
      y = mx::fast::rms_norm(x, L.pre_ffn_norm, c_.eps);
      // The host backend: llmd's vectorized GELU (MLX's CPU tanh runs one float at a time).
      mx::array g = on_device_ ? gelu_tanh(L.gate(y)) : bias_gelu(L.gate(y), std::nullopt, true);
      y = L.down(mx::multiply(g, L.up(y)));
      x = mx::add(x, mx::fast::rms_norm(y, L.post_ffn_norm, c_.eps));
    }
    // Pooling: each image's k x k squares averaged, the pooled grid row by row.
    std::vector<mx::array> pooled;
    int at = 0;
    for (const auto& g : grids) {
      const int h = g[1], w = g[2];
      mx::array part = mx::reshape(mx::slice(x, {at, 0}, {at + h * w, D}), {h / k, k, w / k, k, D});
      pooled.push_back(mx::reshape(mx::mean(part, std::vector<int>{1, 3}), {h * w / (k * k), D}));
      at += h * w;
    }
    x = pooled.size() == 1 ? pooled[0] : mx::concatenate(pooled, 0);
    x = mx::multiply(x, mx::array(std::sqrt(static_cast<float>(D))));
    if (standardize_) x = mx::multiply(mx::subtract(x, standardize_->first), standardize_->second);
    x = mx::fast::rms_norm(x, std::nullopt, c_.eps);
    return host_rows(projection_(x));
  }

 private:
  // The host backend: llmd's flash-attention tile kernels (encoder_ops.h) over each image's
  // span, as siglip.cpp runs SigLIP's (MLX's CPU SDPA runs its softmax one float at a time).
  // The kernels scale scores by 1 / sqrt(head_dim); Gemma 4's scale is 1, so the queries come
  // in multiplied by sqrt(head_dim).
  mx::array host_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           const std::shared_ptr<const EncoderSpans>& spans) const {
    const int N = q.shape(0), H = c_.heads, hd = c_.head_dim;
    mx::array qs = mx::multiply(q, mx::array(std::sqrt(static_cast<float>(hd))));
    mx::array qkv = mx::concatenate(
        {mx::reshape(qs, {N, H * hd}), mx::reshape(k, {N, H * hd}), mx::reshape(v, {N, H * hd})}, 1);
    return encoder_attention(qkv, std::nullopt, spans, H, hd, nullptr);
  }

  Linear patch_;
  mx::array pos_x_, pos_y_;  // [positions, hidden] each
  std::vector<Layer> layers_;
  std::optional<std::pair<mx::array, mx::array>> standardize_;  // (std_bias, std_scale)
  Linear projection_;                                            // embed_vision: [text hidden, hidden]
  std::vector<double> inv_freq_;
};

}  // namespace

std::unique_ptr<VisionTower> load_gemma4_vision(const std::string& dir, const Metadata& config,
                                                const LoadOptions& options) {
  Gemma4VisionConfig c;
  const TowerConfig v(config);
  v.sizes(c);
  v.integers({{"head_dim", &c.head_dim}, {"patch_size", &c.patch}, {"pooling_kernel_size", &c.pool},
              {"position_embedding_size", &c.positions}});
  c.kv_heads = v.integer("num_key_value_heads", c.heads);  // defaults to the query heads read above
  c.eps = v.real("rms_norm_eps", c.eps);
  c.theta = v.real("rope_parameters.rope_theta", c.theta);
  const std::string rope = v.text("rope_parameters.rope_type", "axial");
  if (rope != "axial") throw std::runtime_error("gemma4 vision rope type '" + rope + "' is not supported (axial)");
  const std::string act = v.text("hidden_activation", "gelu_pytorch_tanh");
  if (!is_gelu_tanh(act)) {
    throw std::runtime_error("gemma4 vision activation '" + act + "' is not supported (only GELU-tanh)");
  }
  if (v.flag("attention_bias", false)) {
    throw std::runtime_error("gemma4 vision with attention_bias is not supported (Gemma 4 checkpoints have none)");
  }
  if (c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.heads % c.kv_heads != 0 || c.head_dim <= 0 ||
      c.head_dim % 4 != 0 || c.layers <= 0 || c.patch <= 0 || c.pool <= 0 || c.positions <= 0) {
    throw std::runtime_error("gemma4 vision settings do not describe its encoder (heads, head_dim, patches, pooling)");
  }

  const Checkpoint checkpoint(dir, &config);
  const std::string m = find_prefix(checkpoint, {"model.vision_tower.", "vision_tower."},
                                    "patch_embedder.input_proj.weight", "vision tower");
  const std::string e = m == "vision_tower." ? "embed_vision." : "model.embed_vision.";
  const bool dev = options.on_device();
  const TowerCheckpoint w(checkpoint, dev);
  auto bound = [&](const std::string& lo, const std::string& hi) -> std::optional<std::pair<float, float>> {
    if (!w.has(lo) || !w.has(hi)) return std::nullopt;
    const float a = w.get(lo).item<float>(), b = w.get(hi).item<float>();
    if (!std::isfinite(a) && !std::isfinite(b)) return std::nullopt;  // transformers' unset bounds: +-inf
    return std::make_pair(a, b);
  };
  auto linear = [&](const std::string& module, int out, int in) {
    ClippedLinear l;
    l.map = w.linear({module + ".linear"});
    if (l.map.out_features() != out) {
      throw std::runtime_error("gemma4 vision " + module + " has " + std::to_string(l.map.out_features()) +
                               " outputs, expected " + std::to_string(out) + " (of " + std::to_string(in) + " inputs)");
    }
    l.in = bound(module + ".input_min", module + ".input_max");
    l.out = bound(module + ".output_min", module + ".output_max");
    return l;
  };
  mx::array input_proj = w.get(m + "patch_embedder.input_proj.weight");
  if (input_proj.ndim() != 2 || input_proj.shape(0) != c.hidden || input_proj.shape(1) != c.patch_values()) {
    throw std::runtime_error("gemma4 vision patch embedding is not [hidden_size, 3 * patch_size^2]");
  }
  Linear patch = tower_linear(input_proj, dev);
  mx::array table = w.get(m + "patch_embedder.position_embedding_table");
  if (table.ndim() != 3 || table.shape(0) != 2 || table.shape(1) != c.positions || table.shape(2) != c.hidden) {
    throw std::runtime_error("gemma4 vision position table is not [2, position_embedding_size, hidden_size]");
  }
  mx::array pos_x = mx::contiguous(mx::squeeze(mx::slice(table, {0, 0, 0}, {1, c.positions, c.hidden}), 0));
  mx::array pos_y = mx::contiguous(mx::squeeze(mx::slice(table, {1, 0, 0}, {2, c.positions, c.hidden}), 0));
  mx::eval({pos_x, pos_y});
  const int qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
  std::vector<Layer> layers(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = m + "encoder.layers." + std::to_string(i) + ".";
    Layer& L = layers[i];
    L.input_norm = w.vec(b + "input_layernorm.weight");
    L.post_attn_norm = w.vec(b + "post_attention_layernorm.weight");
    L.pre_ffn_norm = w.vec(b + "pre_feedforward_layernorm.weight");
    L.post_ffn_norm = w.vec(b + "post_feedforward_layernorm.weight");
    L.q_norm = w.vec(b + "self_attn.q_norm.weight");
    L.k_norm = w.vec(b + "self_attn.k_norm.weight");
    L.q = linear(b + "self_attn.q_proj", qw, c.hidden);
    L.k = linear(b + "self_attn.k_proj", kw, c.hidden);
    L.v = linear(b + "self_attn.v_proj", kw, c.hidden);
    L.o = linear(b + "self_attn.o_proj", c.hidden, qw);
    L.gate = linear(b + "mlp.gate_proj", c.ffn, c.hidden);
    L.up = linear(b + "mlp.up_proj", c.ffn, c.hidden);
    L.down = linear(b + "mlp.down_proj", c.hidden, c.ffn);
  }
  std::optional<std::pair<mx::array, mx::array>> standardize;
  if (v.flag("standardize", false)) {
    standardize = std::make_pair(w.vec(m + "std_bias"), w.vec(m + "std_scale"));
  }
  Linear projection = w.linear({e + "embedding_projection"});
  VisionInfo info;
  info.architecture = "gemma4";
  info.channels = 3;
  info.hidden_size = projection.out_features();
  info.patch_values = c.patch_values();
  info.merge_size = c.pool;
  return std::make_unique<Gemma4VisionTower>(c, info, std::move(patch), pos_x, pos_y, std::move(layers),
                                             std::move(standardize), std::move(projection), dev);
}

}  // namespace llmd
