// Qwen3.5's vision encoder (Hugging Face Qwen3_5VisionModel / Qwen3_5MoeVisionModel, the
// `model.visual.*` tensors of the multimodal checkpoints), as transformers 5.23 computes it:
//   patch embedding: a Conv3d whose kernel equals its stride (temporal_patch_size x patch x
//     patch), i.e. one linear map of each flattened patch (channel, frame, y, x), plus bias;
//   learned position embeddings on a square grid (num_position_embeddings = side^2), resampled
//     to each image's patch grid by bilinear interpolation with aligned corners, added;
//   blocks: pre-LayerNorm (eps 1e-6) attention within each image (q|k|v from one biased
//     projection, 2-D rotary: the first half of each head's rotated pairs by the patch's row,
//     the second by its column, frequencies theta^(-4i / head_dim), rotate-half over the whole
//     head), then a biased GELU-tanh MLP;
//   merger: LayerNorm per patch, each 2x2 block of patches (consecutive: the processor lists
//     patches in merge-block order) concatenated, Linear, exact GELU, Linear to the text
//     hidden size. One row per merged block: the rows that replace the `<|image_pad|>` tokens.
// The processor's side (resize, normalize, patch order) is daemon/llmd/text/qwen_images.py.
#include "qwen_vision.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <variant>

#include <mlx/mlx.h>

#include "decoder.h"
#include "vision_tower_common.h"

namespace llmd {

namespace {

struct QwenVisionConfig : EncoderSizes {
  // Qwen3_5VisionConfig's defaults where a config leaves a key out.
  QwenVisionConfig() : EncoderSizes{1152, 4304, 27, 16} {}
  int channels = 3, patch = 16, temporal = 2;  // a patch: channels x temporal frames x patch x patch
  int merge = 2;                               // patches merged a side into one token
  int out_hidden = 3584;
  int positions = 2304;  // learned positions: a square grid
  double theta = 10000.0;
  bool tanh_gelu = true;
  int head_dim() const { return hidden / heads; }
  int patch_values() const { return channels * temporal * patch * patch; }
};

struct Block {
  LayerNormWeights norm1, norm2;
  Linear qkv, proj, fc1, fc2;
  mx::array qkv_bias{0.f}, proj_bias{0.f}, fc1_bias{0.f}, fc2_bias{0.f};
};

constexpr float kEps = 1e-6f;  // transformers' LayerNorms here: fixed, not in the config

// Row and column of patch i of an h x w grid listed in merge-block order (block row, block
// column, row in block, column in block), as the processor flattens them.
std::pair<int, int> patch_place(int i, int w, int m) {
  const int in_col = i % m, in_row = (i / m) % m, blocks_w = w / m;
  const int block_col = (i / (m * m)) % blocks_w, block_row = i / (m * m * blocks_w);
  return {block_row * m + in_row, block_col * m + in_col};
}

class QwenVisionTower : public TowerBase<QwenVisionConfig> {
 public:
  QwenVisionTower(QwenVisionConfig c, VisionInfo info, Linear patch, mx::array patch_bias, mx::array pos_table,
                  std::vector<Block> blocks, LayerNormWeights merge_norm, Linear fc1, mx::array fc1_bias, Linear fc2,
                  mx::array fc2_bias, bool on_device)
      : TowerBase(c, std::move(info), on_device), patch_(std::move(patch)), patch_bias_(std::move(patch_bias)),
        pos_table_(std::move(pos_table)), blocks_(std::move(blocks)), merge_norm_(std::move(merge_norm)),
        fc1_(std::move(fc1)), fc1_bias_(std::move(fc1_bias)), fc2_(std::move(fc2)), fc2_bias_(std::move(fc2_bias)),
        inv_freq_(axial_inv_freq(c_.theta, c_.head_dim())) {}

  std::vector<float> encode(const float*, int) const override {
    throw std::invalid_argument("Qwen3.5 vision towers read images of any size as patches (encode_patches)");
  }

  std::vector<float> encode_patches(const float* patches, const PatchGrids& grids) const override {
    const int m = c_.merge, D = c_.hidden, H = c_.heads, hd = c_.head_dim(), half = hd / 2;
    const int N = grid_patches(grids, m, "Qwen3.5", "merge");
    if (N == 0) return {};
    prepare_thread();
    // Host-side tables per patch: the 4 bilinear taps into the learned position grid and their
    // weights, and the rotary cos/sin at the patch's (row, column).
    const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(c_.positions))));
    std::vector<int32_t> taps(static_cast<size_t>(N) * 4);
    std::vector<float> weights(taps.size()), cos_t(static_cast<size_t>(N) * half), sin_t(cos_t.size());
    const int quarter = static_cast<int>(inv_freq_.size());
    int row0 = 0;
    for (const auto& [t, h, w] : grids) {
      for (int i = 0; i < h * w; ++i) {
        const auto [r, col] = patch_place(i, w, m);
        auto axis = [&](int index, int size, int& lo, int& hi, float& frac) {
          const double src = size > 1 ? static_cast<double>(index) * (side - 1) / (size - 1) : 0.0;
          const double fl = std::floor(src);
          lo = std::min(static_cast<int>(fl), side - 1);
          hi = std::min(static_cast<int>(fl) + 1, side - 1);
          frac = static_cast<float>(src - fl);
        };
        int r0, r1, c0, c1;
        float fr, fc;
        axis(r, h, r0, r1, fr);
        axis(col, w, c0, c1, fc);
        const size_t k = static_cast<size_t>(row0 + i) * 4;
        taps[k] = r0 * side + c0;
        taps[k + 1] = r0 * side + c1;
        taps[k + 2] = r1 * side + c0;
        taps[k + 3] = r1 * side + c1;
        weights[k] = (1 - fr) * (1 - fc);
        weights[k + 1] = (1 - fr) * fc;
        weights[k + 2] = fr * (1 - fc);
        weights[k + 3] = fr * fc;
        float* cs = cos_t.data() + static_cast<size_t>(row0 + i) * half;
        float* sn = sin_t.data() + static_cast<size_t>(row0 + i) * half;
        for (int j = 0; j < quarter; ++j) {
          const double a_row = r * inv_freq_[j], a_col = col * inv_freq_[j];
          cs[j] = static_cast<float>(std::cos(a_row));
          sn[j] = static_cast<float>(std::sin(a_row));
          cs[quarter + j] = static_cast<float>(std::cos(a_col));
          sn[quarter + j] = static_cast<float>(std::sin(a_col));
        }
      }
      row0 += h * w;
    }
    mx::array x(patches, {N, c_.patch_values()}, mx::float32);
    x = mx::add(patch_(x), patch_bias_);
    mx::array pos = mx::take(pos_table_, mx::array(taps.begin(), {N * 4}, mx::int32), 0);
    pos = mx::sum(mx::multiply(mx::reshape(pos, {N, 4, D}), mx::array(weights.begin(), {N, 4, 1}, mx::float32)), 1);
    x = mx::add(x, pos);
    const mx::array cs(cos_t.begin(), {N, 1, half}, mx::float32), sn(sin_t.begin(), {N, 1, half}, mx::float32);
    auto rotate = [&](const mx::array& t) {  // [N, H, hd], rotate-half over the whole head
      mx::array a = mx::slice(t, {0, 0, 0}, {N, H, half}), b = mx::slice(t, {0, 0, half}, {N, H, hd});
      return mx::concatenate({mx::subtract(mx::multiply(a, cs), mx::multiply(b, sn)),
                              mx::add(mx::multiply(b, cs), mx::multiply(a, sn))},
                             2);
    };
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    for (const Block& B : blocks_) {
      mx::array y = mx::fast::layer_norm(x, B.norm1.w, B.norm1.b, kEps);
      mx::array qkv = mx::astype(mx::add(B.qkv(y), B.qkv_bias), mx::float32);
      mx::array q = rotate(mx::reshape(mx::slice(qkv, {0, 0}, {N, D}), {N, H, hd}));
      mx::array k = rotate(mx::reshape(mx::slice(qkv, {0, D}, {N, 2 * D}), {N, H, hd}));
      mx::array v = mx::reshape(mx::slice(qkv, {0, 2 * D}, {N, 3 * D}), {N, H, hd});
      // Each image's patches see every patch of the same image and nothing else.
      mx::array a = per_image_attention(q, k, v, grids, scale);
      x = mx::add(x, mx::add(B.proj(a), B.proj_bias));
      y = mx::fast::layer_norm(x, B.norm2.w, B.norm2.b, kEps);
      y = gelu(mx::add(B.fc1(y), B.fc1_bias), c_.tanh_gelu);
      x = mx::add(x, mx::add(B.fc2(y), B.fc2_bias));
    }
    x = mx::fast::layer_norm(x, merge_norm_.w, merge_norm_.b, kEps);
    x = mx::reshape(x, {N / (m * m), D * m * m});  // the merge block's patches are consecutive rows
    x = gelu(mx::add(fc1_(x), fc1_bias_), false);
    return host_rows(mx::add(fc2_(x), fc2_bias_));
  }

 private:
  Linear patch_;
  mx::array patch_bias_;
  mx::array pos_table_;  // [positions, hidden]
  std::vector<Block> blocks_;
  LayerNormWeights merge_norm_;
  Linear fc1_;
  mx::array fc1_bias_;
  Linear fc2_;
  mx::array fc2_bias_;
  std::vector<double> inv_freq_;
};

// The tower's weights by their Hugging Face names under `model.visual.` ("blocks.0.attn.qkv",
// "merger.linear_fc1", ...), from a checkpoint directory or an mmproj file (its name map
// below): one loader for both.
struct VisionWeights {
  std::function<mx::array(const std::string&)> vec;         // a float tensor ("...bias", "pos_embed.weight")
  std::function<Linear(const std::string&)> linear;         // a module's weight ("blocks.0.attn.qkv")
  std::function<bool(const std::string&)> has;              // whether the tensor exists
  std::function<mx::array()> patch;                         // [hidden, channels, temporal, patch, patch]
};

std::unique_ptr<VisionTower> build_tower(QwenVisionConfig c, const VisionWeights& w, const std::string& arch,
                                         bool dev) {
  const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(c.positions))));
  if (c.hidden <= 0 || c.heads <= 0 || c.hidden % c.heads != 0 || c.head_dim() % 4 != 0 || c.layers <= 0 ||
      c.patch <= 0 || c.temporal <= 0 || c.merge <= 0 || side * side != c.positions) {
    throw std::runtime_error("qwen3.5 vision settings do not describe its encoder (heads, patches or positions)");
  }
  auto vec = [&](const std::string& name) {
    mx::array a = w.vec(name);
    a.eval();
    return a;
  };
  mx::array conv = w.patch();
  if (conv.ndim() != 5 || conv.shape(0) != c.hidden || conv.shape(1) != c.channels || conv.shape(2) != c.temporal ||
      conv.shape(3) != c.patch || conv.shape(4) != c.patch) {
    throw std::runtime_error("qwen3.5 vision patch embedding has an unexpected shape");
  }
  Linear patch = tower_linear(mx::reshape(conv, {c.hidden, c.patch_values()}), dev);
  mx::array table = vec("pos_embed.weight");
  if (table.ndim() != 2 || table.shape(0) != c.positions || table.shape(1) != c.hidden) {
    throw std::runtime_error("qwen3.5 vision position embeddings do not match num_position_embeddings x hidden_size");
  }
  std::vector<Block> blocks(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Block& B = blocks[i];
    B.norm1 = {vec(b + "norm1.weight"), vec(b + "norm1.bias")};
    B.norm2 = {vec(b + "norm2.weight"), vec(b + "norm2.bias")};
    B.qkv = w.linear(b + "attn.qkv");
    B.qkv_bias = vec(b + "attn.qkv.bias");
    B.proj = w.linear(b + "attn.proj");
    B.proj_bias = vec(b + "attn.proj.bias");
    B.fc1 = w.linear(b + "mlp.linear_fc1");
    B.fc1_bias = vec(b + "mlp.linear_fc1.bias");
    B.fc2 = w.linear(b + "mlp.linear_fc2");
    B.fc2_bias = vec(b + "mlp.linear_fc2.bias");
  }
  if (w.has("merger.norm.weight") && vec("merger.norm.weight").shape(0) != c.hidden) {
    throw std::runtime_error("qwen3.5 vision merger norms after the merge (use_postshuffle_norm): not supported");
  }
  LayerNormWeights merge_norm{vec("merger.norm.weight"), vec("merger.norm.bias")};
  Linear fc1 = w.linear("merger.linear_fc1");
  Linear fc2 = w.linear("merger.linear_fc2");
  mx::array fc2_bias = vec("merger.linear_fc2.bias");
  if (fc2_bias.shape(0) != c.out_hidden) {
    throw std::runtime_error("qwen3.5 vision merger output does not match out_hidden_size");
  }
  VisionInfo info;
  info.architecture = arch;
  info.channels = c.channels;
  info.hidden_size = c.out_hidden;
  info.patch_values = c.patch_values();
  info.merge_size = c.merge;
  return std::make_unique<QwenVisionTower>(c, info, std::move(patch), vec("patch_embed.proj.bias"), table,
                                           std::move(blocks), merge_norm, std::move(fc1), vec("merger.linear_fc1.bias"),
                                           std::move(fc2), fc2_bias, dev);
}

// llama.cpp's names for the tower's tensors in an mmproj (conversion/qwen3vl.py and its
// tensor map): Hugging Face name (under model.visual.) -> GGUF name.
std::string mmproj_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> top = {
      {"patch_embed.proj.bias", "v.patch_embd.bias"}, {"pos_embed.weight", "v.position_embd.weight"},
      {"merger.norm.", "v.post_ln."},                  {"merger.linear_fc1.", "mm.0."},
      {"merger.linear_fc2.", "mm.2."}};
  for (const auto& [from, to] : top) {
    if (hf.rfind(from, 0) == 0) return to + hf.substr(from.size());
  }
  static const std::vector<std::pair<std::string, std::string>> layer = {
      {"norm1.", "ln1."},         {"norm2.", "ln2."},          {"attn.qkv.", "attn_qkv."},
      {"attn.proj.", "attn_out."}, {"mlp.linear_fc1.", "ffn_up."}, {"mlp.linear_fc2.", "ffn_down."}};
  if (hf.rfind("blocks.", 0) == 0) {
    const size_t dot = hf.find('.', 7);
    const std::string rest = hf.substr(dot + 1);
    for (const auto& [from, to] : layer) {
      if (rest.rfind(from, 0) == 0) return "v.blk." + hf.substr(7, dot - 7) + "." + to + rest.substr(from.size());
    }
  }
  throw std::logic_error("qwen3.5 vision: no mmproj name for '" + hf + "'");
}

}  // namespace

std::unique_ptr<VisionTower> load_qwen_vision(const std::string& dir, const Metadata& config,
                                              const LoadOptions& options) {
  QwenVisionConfig c;
  const TowerConfig v(config);
  v.sizes(c);
  // Qwen's own names for the depth and heads (depth, num_heads) win over the common ones.
  v.integers({{"depth", &c.layers}, {"num_heads", &c.heads}, {"in_channels", &c.channels}, {"patch_size", &c.patch},
              {"temporal_patch_size", &c.temporal}, {"spatial_merge_size", &c.merge},
              {"out_hidden_size", &c.out_hidden}, {"num_position_embeddings", &c.positions}});
  c.theta = v.real("rope_parameters.rope_theta", c.theta);
  const std::string act = v.text("hidden_act", "gelu_pytorch_tanh");
  if (act == "gelu") {
    c.tanh_gelu = false;
  } else if (!is_gelu_tanh(act)) {
    throw std::runtime_error("qwen3.5 vision activation '" + act + "' is not supported (GELU or GELU-tanh)");
  }
  const Checkpoint checkpoint(dir, &config);
  const std::string m =
      find_prefix(checkpoint, {"model.visual.", "visual."}, "patch_embed.proj.weight", "vision tower");
  const bool dev = options.on_device();
  const TowerCheckpoint w(checkpoint, dev);
  VisionWeights weights;
  weights.vec = [&](const std::string& name) { return w.get(m + name); };
  weights.has = [&](const std::string& name) { return w.has(m + name); };
  weights.linear = [&](const std::string& module) { return w.linear({m + module}); };
  weights.patch = [&] { return w.get(m + "patch_embed.proj.weight"); };
  return build_tower(c, weights, config.get_string("model_type").value_or("qwen3_5_moe"), dev);
}

// llama.cpp's mmproj for Qwen3.5 (`convert_hf_to_gguf.py --mmproj`: clip.projector_type
// "qwen3vl_merger"). Its sizes are `clip.vision.*` keys; the position grid is the stored table's
// (num_position_embeddings rows); the patch embedding's temporal frames are one tensor each
// (v.patch_embd.weight, .weight.1, ...), stacked back here; deepstack layers (Qwen3-VL) are
// refused; RoPE's base is 10000, which llama.cpp's graph (tools/mtmd/models/qwen3vl.cpp) fixes too.
std::unique_ptr<VisionTower> load_qwen_mmproj(const GgufFile& file, const std::string& path, const LoadOptions& options) {
  const MmprojFile mmproj(file, path);
  const Metadata& m = file.metadata();
  if (m.has("clip.vision.is_deepstack_layers")) {
    const auto* deep = std::get_if<std::vector<int64_t>>(&m.values().at("clip.vision.is_deepstack_layers"));
    if (deep && std::any_of(deep->begin(), deep->end(), [](int64_t x) { return x != 0; })) {
      throw std::runtime_error(path + " has deepstack layers (Qwen3-VL): llmd runs Qwen3.5's tower only");
    }
  }
  QwenVisionConfig c;
  c.hidden = mmproj.need("clip.vision.embedding_length");
  c.ffn = mmproj.need("clip.vision.feed_forward_length");
  c.layers = mmproj.need("clip.vision.block_count");
  c.heads = mmproj.need("clip.vision.attention.head_count");
  c.patch = mmproj.need("clip.vision.patch_size");
  c.out_hidden = mmproj.need("clip.vision.projection_dim");
  c.merge = static_cast<int>(m.get_int("clip.vision.spatial_merge_size").value_or(2));
  c.temporal = 0;
  while (file.find("v.patch_embd.weight" + (c.temporal ? "." + std::to_string(c.temporal) : std::string()))) {
    ++c.temporal;
  }
  if (c.temporal == 0) throw std::runtime_error(path + " has no tensor 'v.patch_embd.weight'");
  const TensorView* table = file.find("v.position_embd.weight");
  if (!table || table->shape.size() != 2) throw std::runtime_error(path + " has no 2-D 'v.position_embd.weight'");
  c.positions = static_cast<int>(table->shape[1]);
  const TensorView& frame0 = file.tensor("v.patch_embd.weight");  // GGUF {patch, patch, channels, hidden}
  if (frame0.shape.size() != 4) throw std::runtime_error(path + ": v.patch_embd.weight is not 4-D");
  c.channels = static_cast<int>(frame0.shape[2]);
  if (const auto eps = m.get_float("clip.vision.attention.layer_norm_epsilon"); eps && std::abs(*eps - kEps) > 1e-9) {
    throw std::runtime_error(path + ": layer_norm_epsilon " + std::to_string(*eps) + " (Qwen3.5's towers use 1e-6)");
  }
  const bool dev = options.on_device();
  VisionWeights weights;
  weights.vec = [&](const std::string& name) { return mmproj.vec(mmproj_name(name)); };
  weights.has = [&](const std::string& name) { return mmproj.has(mmproj_name(name)); };
  weights.linear = [&](const std::string& module) {
    // mmproj_name maps a module's weight; the GGUF module is that name less ".weight".
    std::string name = mmproj_name(module + ".weight");
    return mmproj.linear({name.substr(0, name.size() - 7)}, dev);
  };
  weights.patch = [&] {
    std::vector<mx::array> frames;  // each [hidden, channels, patch, patch]
    for (int f = 0; f < c.temporal; ++f) {
      frames.push_back(mmproj.vec("v.patch_embd.weight" + (f ? "." + std::to_string(f) : std::string())));
    }
    return mx::stack(frames, 2);
  };
  return build_tower(c, weights, "qwen3_5_moe", dev);
}

}  // namespace llmd
