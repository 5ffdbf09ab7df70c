// Gemma 3's vision half (Hugging Face Gemma3ForConditionalGeneration: `vision_tower.*` and
// `multi_modal_projector.*`), as transformers computes it:
//   SigLIP encoder: a patch_size x patch_size convolution (stride = kernel: one linear map of
//     each patch's channel-major pixels) plus learned position embeddings, then pre-LayerNorm
//     layers (bidirectional attention with q/k/v/out biases; a GELU-tanh MLP with biases), then
//     a final LayerNorm;
//   projector: the patch grid average-pooled to sqrt(mm_tokens_per_image) a side (4x4 patches
//     per token in the released checkpoints: 64x64 patches -> 256 tokens), an RMS norm
//     (x * (1 + w), eps of the vision config), and a matmul into the text hidden size.
// The result replaces the token embeddings of the `<image_soft_token>` rows as it is: the
// decoder's sqrt(hidden) scaling applies to token embeddings only.
#include "siglip.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>

#include <mlx/mlx.h>

#include "decoder.h"
#include "encoder_ops.h"
#include "gemma4_vision.h"
#include "qwen_vision.h"
#include "vision_tower_common.h"

namespace llmd {

namespace {

struct SiglipConfig : EncoderSizes {
  // SiglipVisionConfig's defaults where a config leaves a key out.
  SiglipConfig() : EncoderSizes{768, 3072, 12, 12} {}
  int channels = 3;
  int image_size = 224;
  int patch_size = 16;
  float eps = 1e-6f;
  int tokens_per_image = 256;
};

struct SiglipLayer {
  LayerNormWeights norm1, norm2;
  Linear qkv;  // q | k | v rows
  mx::array qkv_bias{0.f};
  Linear out;
  mx::array out_bias{0.f};
  Linear fc1;
  mx::array fc1_bias{0.f};
  Linear fc2;
  mx::array fc2_bias{0.f};
};

class Gemma3VisionTower : public TowerBase<SiglipConfig> {
 public:
  Gemma3VisionTower(SiglipConfig c, VisionInfo info, Linear patch, mx::array patch_bias, mx::array positions,
                    std::vector<SiglipLayer> layers, LayerNormWeights post_norm, mx::array soft_norm, Linear projection,
                    bool on_device)
      : TowerBase(c, std::move(info), on_device), patch_(std::move(patch)), patch_bias_(std::move(patch_bias)),
        positions_(std::move(positions)), layers_(std::move(layers)), post_norm_(std::move(post_norm)),
        soft_norm_(std::move(soft_norm)), projection_(std::move(projection)) {
    if (on_device_) return;
    // F16 mmproj weights too run llmd's float GEMM (float16 panels where its AVX-512 kernel
    // runs), not MLX's matmul through the BLAS: the fused epilogues need it, and the BLAS's
    // threads spin beside llmd's. A no-op for weights already packed or quantized.
    for (SiglipLayer& L : layers_) {
      for (Linear* l : {&L.qkv, &L.out, &L.fc1, &L.fc2}) l->use_host_float_gemm();
    }
  }

  std::vector<float> encode(const float* pixels, int n) const override {
    if (n <= 0) return {};
    prepare_thread();
    const int S = c_.image_size, p = c_.patch_size, g = S / p, P = g * g, D = c_.hidden, C = c_.channels;
    const int H = c_.heads, hd = D / H;
    mx::array x(pixels, {n, C, S, S}, mx::float32);
    // Patches as rows of channel-major pixels (the convolution kernel's layout), row by row.
    x = mx::reshape(x, {n, C, g, p, g, p});
    x = mx::reshape(mx::transpose(x, {0, 2, 4, 1, 3, 5}), {n * P, C * p * p});
    if (on_device_) {
      x = mx::add(patch_(x), patch_bias_);
      x = mx::reshape(mx::add(mx::reshape(x, {n, P, D}), positions_), {n * P, D});
    } else {
      const mx::array pos = n == 1 ? positions_ : mx::reshape(mx::broadcast_to(positions_, {n, P, D}), {n * P, D});
      x = patch_.with_epilogue(x, {.bias = patch_bias_, .residual = pos});
    }
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    auto heads = [&](const mx::array& qkv, int part) {
      mx::array t = mx::slice(qkv, {0, part * D}, {n * P, (part + 1) * D});
      return mx::transpose(mx::reshape(t, {n, P, H, hd}), {0, 2, 1, 3});
    };
    auto device_attention = [&](const mx::array& qkv) {
      mx::array a = mx::fast::scaled_dot_product_attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), scale);
      return mx::reshape(mx::transpose(a, {0, 2, 1, 3}), {n * P, D});
    };
    // Each image one span: every patch sees every other patch of its image, and nothing else.
    std::shared_ptr<const EncoderSpans> spans;
    if (!on_device_) {
      auto s = std::make_shared<EncoderSpans>();
      for (int i = 0; i < n; ++i) s->emplace_back(i * P, P);
      spans = std::move(s);
    }
    for (const SiglipLayer& L : layers_) {
      if (on_device_) {
        mx::array h = mx::fast::layer_norm(x, L.norm1.w, L.norm1.b, c_.eps);
        mx::array a = device_attention(mx::add(L.qkv(h), L.qkv_bias));
        x = mx::add(x, mx::add(L.out(a), L.out_bias));
        h = mx::fast::layer_norm(x, L.norm2.w, L.norm2.b, c_.eps);
        h = gelu_tanh(mx::add(L.fc1(h), L.fc1_bias));
        x = mx::add(x, mx::add(L.fc2(h), L.fc2_bias));
        continue;
      }
      // The host backend: each matmul's bias, GELU and residual inside the float GEMM
      // (float_gemm.h: the output written once), LayerNorms on llmd's threads (encoder_ops.h;
      // MLX's CPU LayerNorm runs on one), attention on llmd's flash kernels.
      mx::array h = add_layer_norm(x, std::nullopt, std::nullopt, L.norm1.w, L.norm1.b, c_.eps);
      mx::array a = host_attention(L.qkv.with_epilogue(h, {.bias = L.qkv_bias}), spans, n * P);
      x = L.out.with_epilogue(a, {.bias = L.out_bias, .residual = x});
      h = add_layer_norm(x, std::nullopt, std::nullopt, L.norm2.w, L.norm2.b, c_.eps);
      h = L.fc1.with_epilogue(h, {.bias = L.fc1_bias, .gelu_tanh = true});
      x = L.fc2.with_epilogue(h, {.bias = L.fc2_bias, .residual = x});
    }
    x = mx::fast::layer_norm(x, post_norm_.w, post_norm_.b, c_.eps);
    // Average pooling of k x k patch squares, tokens row by row (AvgPool2d over the grid).
    const int t = static_cast<int>(std::lround(std::sqrt(static_cast<double>(c_.tokens_per_image))));
    const int k = g / t;
    x = mx::mean(mx::reshape(x, {n, t, k, t, k, D}), std::vector<int>{2, 4});
    x = mx::reshape(x, {n * t * t, D});
    x = mx::fast::rms_norm(x, soft_norm_, c_.eps);
    return host_rows(projection_(x));
  }

 private:
  // Attention on the host backend: llmd's flash-attention tile kernels (encoder_ops.h) over
  // each image's span. MLX's CPU SDPA materializes every head's [patches, patches] scores and
  // runs their softmax one float at a time: at 896x896 (4096 patches, 16 heads) that softmax
  // took 3.3 s of a layer's 4.2 s. The kernels take head sizes in multiples of 16; SigLIP's
  // (1152 / 16 = 72) gets zero columns (unchanged dot products and outputs), its queries
  // scaled by sqrt(padded / head size) so the kernels' 1 / sqrt(padded) is the model's scale.
  // `qkv` has its biases added.
  mx::array host_attention(const mx::array& qkv, const std::shared_ptr<const EncoderSpans>& spans, int rows) const {
    const int H = c_.heads, hd = c_.hidden / H, padded = (hd + 15) / 16 * 16;
    if (padded == hd) return encoder_attention(qkv, std::nullopt, spans, H, hd, nullptr);
    mx::array t = mx::reshape(qkv, {rows, 3, H, hd});
    const float q_scale = std::sqrt(static_cast<float>(padded) / static_cast<float>(hd));
    t = mx::multiply(t, mx::reshape(mx::array({q_scale, 1.f, 1.f}), {1, 3, 1, 1}));
    t = mx::pad(t, std::vector<int>{3}, mx::Shape{0}, mx::Shape{padded - hd}, mx::array(0.f));
    t = mx::reshape(t, {rows, 3 * H * padded});
    mx::array a = mx::reshape(encoder_attention(t, std::nullopt, spans, H, padded, nullptr), {rows, H, padded});
    return mx::reshape(mx::slice(a, {0, 0, 0}, {rows, H, hd}), {rows, c_.hidden});
  }

  Linear patch_;
  mx::array patch_bias_;
  mx::array positions_;  // [patches, hidden]
  std::vector<SiglipLayer> layers_;
  LayerNormWeights post_norm_;
  mx::array soft_norm_;  // 1 + w
  Linear projection_;    // [text hidden, vision hidden]
};

// Checks shared by both loaders: the numbers describe a SigLIP encoder whose patch grid pools
// evenly into tokens_per_image tokens.
void check_siglip(const SiglipConfig& c) {
  if (c.hidden <= 0 || c.heads <= 0 || c.hidden % c.heads != 0 || c.layers <= 0 || c.patch_size <= 0 ||
      c.image_size % c.patch_size != 0) {
    throw std::runtime_error("gemma3 vision settings do not describe a SigLIP encoder");
  }
  const int side = c.image_size / c.patch_size;
  const int t = static_cast<int>(std::lround(std::sqrt(static_cast<double>(c.tokens_per_image))));
  if (t <= 0 || t * t != c.tokens_per_image || side % t != 0) {
    throw std::runtime_error("gemma3 mm_tokens_per_image " + std::to_string(c.tokens_per_image) +
                             " does not pool a " + std::to_string(side) + "x" + std::to_string(side) +
                             " patch grid evenly");
  }
}

// One SigLIP layer's module names: the checkpoint's or the mmproj's.
struct SiglipNames {
  std::string norm1, norm2, q, k, v, out, fc1, fc2;
};

// `count` SigLIP layers, layer N's modules under `prefix` + N + "." (`vec`: a float tensor;
// `linear`: the modules' weights stacked into one Linear).
std::vector<SiglipLayer> siglip_layers(int count, const std::string& prefix, const SiglipNames& n,
                                       const std::function<mx::array(const std::string&)>& vec,
                                       const std::function<Linear(const std::vector<std::string>&)>& linear) {
  std::vector<SiglipLayer> layers(count);
  for (int i = 0; i < count; ++i) {
    const std::string b = prefix + std::to_string(i) + ".";
    SiglipLayer& L = layers[i];
    L.norm1 = {vec(b + n.norm1 + ".weight"), vec(b + n.norm1 + ".bias")};
    L.norm2 = {vec(b + n.norm2 + ".weight"), vec(b + n.norm2 + ".bias")};
    const std::vector<std::string> qkv = {b + n.q, b + n.k, b + n.v};
    L.qkv = linear(qkv);
    L.qkv_bias = mx::concatenate({vec(qkv[0] + ".bias"), vec(qkv[1] + ".bias"), vec(qkv[2] + ".bias")}, 0);
    L.qkv_bias.eval();
    L.out = linear({b + n.out});
    L.out_bias = vec(b + n.out + ".bias");
    L.fc1 = linear({b + n.fc1});
    L.fc1_bias = vec(b + n.fc1 + ".bias");
    L.fc2 = linear({b + n.fc2});
    L.fc2_bias = vec(b + n.fc2 + ".bias");
  }
  return layers;
}

// The projector's matrix, stored [vision hidden, text hidden] (a matmul's right operand), as a
// Linear: its transpose. `what` names it in the error.
Linear gemma3_projection(const mx::array& proj, const SiglipConfig& c, const std::string& what, bool dev) {
  if (proj.ndim() != 2 || proj.shape(0) != c.hidden) {
    throw std::runtime_error(what + " does not start at the vision hidden size");
  }
  return tower_linear(mx::contiguous(mx::transpose(proj)), dev);
}

VisionInfo gemma3_info(const SiglipConfig& c, int text_hidden) {
  VisionInfo info;
  info.architecture = "gemma3";
  info.image_size = c.image_size;
  info.channels = c.channels;
  info.tokens_per_image = c.tokens_per_image;
  info.hidden_size = text_hidden;
  return info;
}

std::unique_ptr<VisionTower> load_gemma3_vision(const std::string& dir, const Metadata& config,
                                                const LoadOptions& options) {
  SiglipConfig c;
  const TowerConfig v(config);
  v.sizes(c);
  v.integers({{"num_channels", &c.channels}, {"image_size", &c.image_size}, {"patch_size", &c.patch_size}});
  c.eps = v.real("layer_norm_eps", c.eps);
  c.tokens_per_image = TowerConfig(config, "").integer("mm_tokens_per_image", c.tokens_per_image);
  const std::string act = v.text("hidden_act", "gelu_pytorch_tanh");
  if (!is_gelu_tanh(act)) {
    throw std::runtime_error("gemma3 vision tower activation '" + act + "' is not supported (only GELU-tanh)");
  }
  check_siglip(c);
  const int side = c.image_size / c.patch_size;

  const Checkpoint checkpoint(dir, &config);
  const std::string m = find_prefix(checkpoint, {"vision_tower.vision_model.", "model.vision_tower.vision_model.",
                                        "model.vision_tower.", "vision_tower."},
                                    "embeddings.patch_embedding.weight", "vision tower");
  const std::string pj = find_prefix(checkpoint, {"multi_modal_projector.", "model.multi_modal_projector."},
                                     "mm_input_projection_weight", "multimodal projector");
  const bool dev = options.on_device();
  const TowerCheckpoint w(checkpoint, dev);
  auto vec = [&](const std::string& name) { return w.vec(name); };

  mx::array conv = w.get(m + "embeddings.patch_embedding.weight");
  if (conv.ndim() != 4 || conv.shape(0) != c.hidden || conv.shape(1) != c.channels ||
      conv.shape(2) != c.patch_size || conv.shape(3) != c.patch_size) {
    throw std::runtime_error("gemma3 vision patch embedding has an unexpected shape");
  }
  Linear patch = tower_linear(mx::reshape(conv, {c.hidden, c.channels * c.patch_size * c.patch_size}), dev);
  mx::array positions = vec(m + "embeddings.position_embedding.weight");
  if (positions.ndim() != 2 || positions.shape(0) != side * side || positions.shape(1) != c.hidden) {
    throw std::runtime_error("gemma3 vision position embeddings do not match the patch grid");
  }

  std::vector<SiglipLayer> layers = siglip_layers(
      c.layers, m + "encoder.layers.",
      {"layer_norm1", "layer_norm2", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
       "mlp.fc1", "mlp.fc2"},
      vec, [&](const std::vector<std::string>& modules) { return w.linear(modules); });
  LayerNormWeights post{vec(m + "post_layernorm.weight"), vec(m + "post_layernorm.bias")};
  mx::array soft_norm = mx::add(w.get(pj + "mm_soft_emb_norm.weight"), mx::array(1.f));  // Gemma RMSNorm
  soft_norm.eval();
  mx::array proj = w.get(pj + "mm_input_projection_weight");
  Linear projection = gemma3_projection(proj, c, "gemma3 mm_input_projection_weight", dev);
  const VisionInfo info = gemma3_info(c, proj.shape(1));
  mx::array patch_bias = vec(m + "embeddings.patch_embedding.bias");
  return std::make_unique<Gemma3VisionTower>(c, info, std::move(patch), patch_bias, positions, std::move(layers), post,
                                             soft_norm, std::move(projection), dev);
}

// llama.cpp's mmproj GGUF for Gemma 3 (what `convert_hf_to_gguf.py --mmproj` writes):
// `clip.projector_type` "gemma3", the encoder's sizes under `clip.vision.*`, the SigLIP tensors
// as `v.*` (v.patch_embd, v.position_embd, v.blk.N.{ln1,attn_q,attn_k,attn_v,attn_out,ln2,
// ffn_up (fc1),ffn_down (fc2)}, v.post_ln) and the projector as `mm.*`. Two differences from
// the Hugging Face tensors: mm.soft_emb_norm already holds 1 + w (the converter folds Gemma's
// RMSNorm offset in), and the pooled grid side is image_size / patch_size /
// clip.vision.projector.scale_factor (4 when the key is absent, as clip.cpp reads it).
std::unique_ptr<VisionTower> load_gemma3_mmproj(const std::string& path, const LoadOptions& options) {
  const GgufFile file(path);
  const Metadata& m = file.metadata();
  const std::string projector = m.get_string("clip.projector_type").value_or("");
  if (projector == "qwen3vl_merger") return load_qwen_mmproj(file, path, options);
  if (projector != "gemma3") {
    throw std::runtime_error(path + " is not a Gemma 3 or Qwen3.5 mmproj (clip.projector_type '" + projector + "')");
  }
  const MmprojFile mmproj(file, path);
  auto need = [&](const std::string& key) { return mmproj.need(key); };
  SiglipConfig c;
  c.hidden = need("clip.vision.embedding_length");
  c.ffn = need("clip.vision.feed_forward_length");
  c.layers = need("clip.vision.block_count");
  c.heads = need("clip.vision.attention.head_count");
  c.image_size = need("clip.vision.image_size");
  c.patch_size = need("clip.vision.patch_size");
  c.eps = static_cast<float>(m.get_float("clip.vision.attention.layer_norm_epsilon").value_or(c.eps));
  const int scale = static_cast<int>(m.get_int("clip.vision.projector.scale_factor").value_or(4));
  if (c.patch_size <= 0 || scale <= 0 || (c.image_size / c.patch_size) % scale != 0) {
    throw std::runtime_error(path + ": the patch grid does not pool by clip.vision.projector.scale_factor");
  }
  const int per_side = c.image_size / c.patch_size / scale;
  c.tokens_per_image = per_side * per_side;
  check_siglip(c);
  if (m.get_bool("clip.use_gelu").has_value() && !*m.get_bool("clip.use_gelu")) {
    throw std::runtime_error(path + ": only GELU SigLIP encoders are supported (clip.use_gelu is false)");
  }

  const bool dev = options.on_device();
  auto vec = [&](const std::string& name) { return mmproj.vec(name); };

  mx::array conv = vec("v.patch_embd.weight");  // [hidden, channels, patch, patch]
  if (conv.ndim() != 4 || conv.shape(0) != c.hidden || conv.shape(2) != c.patch_size ||
      conv.shape(3) != c.patch_size) {
    throw std::runtime_error(path + ": v.patch_embd.weight has an unexpected shape");
  }
  c.channels = conv.shape(1);
  Linear patch = tower_linear(mx::reshape(conv, {c.hidden, c.channels * c.patch_size * c.patch_size}), dev);
  const int side = c.image_size / c.patch_size;
  mx::array positions = vec("v.position_embd.weight");
  if (positions.ndim() != 2 || positions.shape(0) != side * side || positions.shape(1) != c.hidden) {
    throw std::runtime_error(path + ": v.position_embd.weight does not match the patch grid");
  }
  std::vector<SiglipLayer> layers =
      siglip_layers(c.layers, "v.blk.", {"ln1", "ln2", "attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"},
                    vec, [&](const std::vector<std::string>& names) { return mmproj.linear(names, dev); });
  LayerNormWeights post{vec("v.post_ln.weight"), vec("v.post_ln.bias")};
  mx::array soft_norm = vec("mm.soft_emb_norm.weight");  // already 1 + w
  mx::array proj = vec("mm.input_projection.weight");    // [vision hidden, text hidden], as HF stores it
  Linear projection = gemma3_projection(proj, c, path + ": mm.input_projection.weight", dev);
  const VisionInfo info = gemma3_info(c, proj.shape(1));
  return std::make_unique<Gemma3VisionTower>(c, info, std::move(patch), vec("v.patch_embd.bias"), positions,
                                             std::move(layers), post, soft_norm, std::move(projection), dev);
}

}  // namespace

std::vector<float> VisionTower::encode_patches(const float*, const std::vector<std::array<int, 3>>&) const {
  throw std::invalid_argument(info().architecture + " vision towers read whole images of one size (encode)");
}

std::unique_ptr<VisionTower> load_vision_tower(const std::string& dir, const Metadata& config,
                                               const LoadOptions& options) {
  if (!std::filesystem::is_directory(dir)) return load_gemma3_mmproj(dir, options);  // a GGUF mmproj file
  const std::string type = config.get_string("model_type").value_or("");
  if (type == "gemma3") return load_gemma3_vision(dir, config, options);
  if (type == "qwen3_5_moe" || type == "qwen3_5") return load_qwen_vision(dir, config, options);
  if (type == "gemma4") return load_gemma4_vision(dir, config, options);
  throw std::runtime_error("llmd cannot run the vision tower of model type '" + type + "' yet");
}

}  // namespace llmd
