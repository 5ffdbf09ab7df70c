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
#include <memory>
#include <stdexcept>

#include <mlx/mlx.h>

#include "decoder.h"
#include "encoder_ops.h"
#include "gemma4_vision.h"
#include "qwen_vision.h"

namespace llmd {

namespace {

struct SiglipConfig {
  int hidden = 768;  // SiglipVisionConfig's defaults where a config leaves a key out
  int ffn = 3072;
  int layers = 12;
  int heads = 12;
  int channels = 3;
  int image_size = 224;
  int patch_size = 16;
  float eps = 1e-6f;
  int tokens_per_image = 256;
};

struct LayerNorm {
  mx::array w{0.f}, b{0.f};
};

struct SiglipLayer {
  LayerNorm norm1, norm2;
  Linear qkv;  // q | k | v rows
  mx::array qkv_bias{0.f};
  Linear out;
  mx::array out_bias{0.f};
  Linear fc1;
  mx::array fc1_bias{0.f};
  Linear fc2;
  mx::array fc2_bias{0.f};
};

mx::array gelu_tanh(const mx::array& x) {
  const float c = std::sqrt(2.f / static_cast<float>(M_PI));
  mx::array cube = mx::multiply(mx::multiply(x, x), x);
  mx::array inner = mx::multiply(mx::array(c), mx::add(x, mx::multiply(mx::array(0.044715f), cube)));
  return mx::multiply(mx::multiply(mx::array(0.5f), x), mx::add(mx::array(1.f), mx::tanh(inner)));
}

class Gemma3VisionTower : public VisionTower {
 public:
  Gemma3VisionTower(SiglipConfig c, VisionInfo info, Linear patch, mx::array patch_bias, mx::array positions,
                    std::vector<SiglipLayer> layers, LayerNorm post_norm, mx::array soft_norm, Linear projection,
                    bool on_device)
      : c_(c), info_(std::move(info)), patch_(std::move(patch)), patch_bias_(std::move(patch_bias)),
        positions_(std::move(positions)), layers_(std::move(layers)), post_norm_(std::move(post_norm)),
        soft_norm_(std::move(soft_norm)), projection_(std::move(projection)), on_device_(on_device),
        device_(mx::default_device()) {
    if (on_device_) return;
    // F16 mmproj weights too run llmd's float GEMM (float16 panels where its AVX-512 kernel
    // runs), not MLX's matmul through the BLAS: the fused epilogues need it, and the BLAS's
    // threads spin beside llmd's. A no-op for weights already packed or quantized.
    for (SiglipLayer& L : layers_) {
      for (Linear* l : {&L.qkv, &L.out, &L.fc1, &L.fc2}) l->use_host_float_gemm();
    }
  }

  const VisionInfo& info() const override { return info_; }

  std::vector<float> encode(const float* pixels, int n) const override {
    if (n <= 0) return {};
    if (on_device_) {
      // As the engine's steps (DeviceState::prepare): MLX's GPU streams belong to the thread
      // that made them, and the worker encodes on a thread of its own.
      mx::set_default_device(device_);
      thread_local bool has_stream = false;
      if (!has_stream) {
        mx::set_default_stream(mx::new_stream(device_));
        has_stream = true;
      }
    }
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
    x = mx::contiguous(mx::astype(projection_(x), mx::float32));
    x.eval();
    return std::vector<float>(x.data<float>(), x.data<float>() + x.size());
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

  SiglipConfig c_;
  VisionInfo info_;
  Linear patch_;
  mx::array patch_bias_;
  mx::array positions_;  // [patches, hidden]
  std::vector<SiglipLayer> layers_;
  LayerNorm post_norm_;
  mx::array soft_norm_;  // 1 + w
  Linear projection_;    // [text hidden, vision hidden]
  bool on_device_;
  mx::Device device_;
};

// The first of `prefixes` under which the checkpoint has `probe`; throws naming `what` if none.
std::string find_prefix(const Checkpoint& w, const std::vector<std::string>& prefixes, const std::string& probe,
                        const std::string& what) {
  for (const std::string& p : prefixes) {
    if (w.has(p + probe)) return p;
  }
  throw std::runtime_error("this checkpoint has no " + what + " (no tensor '" + prefixes.front() + probe + "')");
}

int config_int(const Metadata& m, const std::string& key, int fallback) {
  return static_cast<int>(m.get_int(key).value_or(fallback));
}

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

std::unique_ptr<VisionTower> load_gemma3_vision(const std::string& dir, const Metadata& config,
                                                const LoadOptions& options) {
  SiglipConfig c;
  const std::string v = "vision_config.";
  c.hidden = config_int(config, v + "hidden_size", c.hidden);
  c.ffn = config_int(config, v + "intermediate_size", c.ffn);
  c.layers = config_int(config, v + "num_hidden_layers", c.layers);
  c.heads = config_int(config, v + "num_attention_heads", c.heads);
  c.channels = config_int(config, v + "num_channels", c.channels);
  c.image_size = config_int(config, v + "image_size", c.image_size);
  c.patch_size = config_int(config, v + "patch_size", c.patch_size);
  c.eps = static_cast<float>(config.get_float(v + "layer_norm_eps").value_or(c.eps));
  c.tokens_per_image = config_int(config, "mm_tokens_per_image", c.tokens_per_image);
  const std::string act = config.get_string(v + "hidden_act").value_or("gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_new" && act != "gelu_fast") {
    throw std::runtime_error("gemma3 vision tower activation '" + act + "' is not supported (only GELU-tanh)");
  }
  check_siglip(c);
  const int side = c.image_size / c.patch_size;

  const Checkpoint w(dir, &config);
  const std::string m = find_prefix(w, {"vision_tower.vision_model.", "model.vision_tower.vision_model.",
                                        "model.vision_tower.", "vision_tower."},
                                    "embeddings.patch_embedding.weight", "vision tower");
  const std::string pj = find_prefix(w, {"multi_modal_projector.", "model.multi_modal_projector."},
                                     "mm_input_projection_weight", "multimodal projector");
  const bool dev = options.on_device();
  auto vec = [&](const std::string& name) {
    mx::array a = w.get(name);
    a.eval();
    return a;
  };
  auto linear = [&](const std::vector<std::string>& modules) {
    Linear l = w.linear(modules, dev);
    if (!dev) l.use_host_float_gemm();
    return l;
  };
  auto stacked_bias = [&](const std::vector<std::string>& modules) {
    std::vector<mx::array> parts;
    for (const std::string& mod : modules) parts.push_back(w.get(mod + ".bias"));
    mx::array b = mx::concatenate(parts, 0);
    b.eval();
    return b;
  };

  mx::array conv = w.get(m + "embeddings.patch_embedding.weight");
  if (conv.ndim() != 4 || conv.shape(0) != c.hidden || conv.shape(1) != c.channels ||
      conv.shape(2) != c.patch_size || conv.shape(3) != c.patch_size) {
    throw std::runtime_error("gemma3 vision patch embedding has an unexpected shape");
  }
  Linear patch = Linear::from_float(mx::reshape(conv, {c.hidden, c.channels * c.patch_size * c.patch_size}), dev);
  if (!dev) patch.use_host_float_gemm();
  mx::array positions = vec(m + "embeddings.position_embedding.weight");
  if (positions.ndim() != 2 || positions.shape(0) != side * side || positions.shape(1) != c.hidden) {
    throw std::runtime_error("gemma3 vision position embeddings do not match the patch grid");
  }

  std::vector<SiglipLayer> layers(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = m + "encoder.layers." + std::to_string(i) + ".";
    SiglipLayer& L = layers[i];
    L.norm1 = {vec(b + "layer_norm1.weight"), vec(b + "layer_norm1.bias")};
    L.norm2 = {vec(b + "layer_norm2.weight"), vec(b + "layer_norm2.bias")};
    const std::vector<std::string> qkv = {b + "self_attn.q_proj", b + "self_attn.k_proj", b + "self_attn.v_proj"};
    L.qkv = linear(qkv);
    L.qkv_bias = stacked_bias(qkv);
    L.out = linear({b + "self_attn.out_proj"});
    L.out_bias = vec(b + "self_attn.out_proj.bias");
    L.fc1 = linear({b + "mlp.fc1"});
    L.fc1_bias = vec(b + "mlp.fc1.bias");
    L.fc2 = linear({b + "mlp.fc2"});
    L.fc2_bias = vec(b + "mlp.fc2.bias");
  }
  LayerNorm post{vec(m + "post_layernorm.weight"), vec(m + "post_layernorm.bias")};
  mx::array soft_norm = mx::add(w.get(pj + "mm_soft_emb_norm.weight"), mx::array(1.f));  // Gemma RMSNorm
  soft_norm.eval();
  // Stored [vision hidden, text hidden] (a matmul's right operand): as a Linear, its transpose.
  mx::array proj = w.get(pj + "mm_input_projection_weight");
  if (proj.ndim() != 2 || proj.shape(0) != c.hidden) {
    throw std::runtime_error("gemma3 mm_input_projection_weight does not start at the vision hidden size");
  }
  const int text_hidden = proj.shape(1);
  Linear projection = Linear::from_float(mx::contiguous(mx::transpose(proj)), dev);
  if (!dev) projection.use_host_float_gemm();

  VisionInfo info;
  info.architecture = "gemma3";
  info.image_size = c.image_size;
  info.channels = c.channels;
  info.tokens_per_image = c.tokens_per_image;
  info.hidden_size = text_hidden;
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
  if (!m.get_bool("clip.has_vision_encoder").value_or(false)) {
    throw std::runtime_error(path + " has no vision encoder (clip.has_vision_encoder)");
  }
  auto need = [&](const std::string& key) {
    const std::optional<int64_t> v = m.get_int(key);
    if (!v) throw std::runtime_error(path + " lacks '" + key + "'");
    return static_cast<int>(*v);
  };
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
  auto t = [&](const std::string& name) -> const TensorView& {
    const TensorView* v = file.find(name);
    if (!v) throw std::runtime_error(path + " has no tensor '" + name + "'");
    return *v;
  };
  auto vec = [&](const std::string& name) { return dequantize_tensor(t(name)); };
  auto linear = [&](const std::vector<std::string>& names) {
    std::vector<const TensorView*> parts;
    for (const std::string& n : names) parts.push_back(&t(n + ".weight"));
    if (parts[0]->type == TensorType::F32) {  // float weights: the host GEMM, as the HF path
      std::vector<mx::array> rows;
      for (const TensorView* p : parts) rows.push_back(dequantize_tensor(*p));
      Linear l = Linear::from_float(rows.size() == 1 ? rows[0] : mx::concatenate(rows, 0), dev);
      if (!dev) l.use_host_float_gemm();
      return l;
    }
    return Linear::from_gguf(parts, false, dev);  // F16 / quantized blocks stay as stored
  };
  auto stacked_bias = [&](const std::vector<std::string>& names) {
    std::vector<mx::array> parts;
    for (const std::string& n : names) parts.push_back(vec(n + ".bias"));
    mx::array b = mx::concatenate(parts, 0);
    b.eval();
    return b;
  };

  mx::array conv = vec("v.patch_embd.weight");  // [hidden, channels, patch, patch]
  if (conv.ndim() != 4 || conv.shape(0) != c.hidden || conv.shape(2) != c.patch_size ||
      conv.shape(3) != c.patch_size) {
    throw std::runtime_error(path + ": v.patch_embd.weight has an unexpected shape");
  }
  c.channels = conv.shape(1);
  Linear patch = Linear::from_float(mx::reshape(conv, {c.hidden, c.channels * c.patch_size * c.patch_size}), dev);
  if (!dev) patch.use_host_float_gemm();
  const int side = c.image_size / c.patch_size;
  mx::array positions = vec("v.position_embd.weight");
  if (positions.ndim() != 2 || positions.shape(0) != side * side || positions.shape(1) != c.hidden) {
    throw std::runtime_error(path + ": v.position_embd.weight does not match the patch grid");
  }
  std::vector<SiglipLayer> layers(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = "v.blk." + std::to_string(i) + ".";
    SiglipLayer& L = layers[i];
    L.norm1 = {vec(b + "ln1.weight"), vec(b + "ln1.bias")};
    L.norm2 = {vec(b + "ln2.weight"), vec(b + "ln2.bias")};
    const std::vector<std::string> qkv = {b + "attn_q", b + "attn_k", b + "attn_v"};
    L.qkv = linear(qkv);
    L.qkv_bias = stacked_bias(qkv);
    L.out = linear({b + "attn_out"});
    L.out_bias = vec(b + "attn_out.bias");
    L.fc1 = linear({b + "ffn_up"});
    L.fc1_bias = vec(b + "ffn_up.bias");
    L.fc2 = linear({b + "ffn_down"});
    L.fc2_bias = vec(b + "ffn_down.bias");
  }
  LayerNorm post{vec("v.post_ln.weight"), vec("v.post_ln.bias")};
  mx::array soft_norm = vec("mm.soft_emb_norm.weight");  // already 1 + w
  mx::array proj = vec("mm.input_projection.weight");    // [vision hidden, text hidden], as HF stores it
  if (proj.ndim() != 2 || proj.shape(0) != c.hidden) {
    throw std::runtime_error(path + ": mm.input_projection.weight does not start at the vision hidden size");
  }
  const int text_hidden = proj.shape(1);
  Linear projection = Linear::from_float(mx::contiguous(mx::transpose(proj)), dev);
  if (!dev) projection.use_host_float_gemm();

  VisionInfo info;
  info.architecture = "gemma3";
  info.image_size = c.image_size;
  info.channels = c.channels;
  info.tokens_per_image = c.tokens_per_image;
  info.hidden_size = text_hidden;
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
