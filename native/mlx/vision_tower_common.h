// Pieces the vision towers (siglip.cpp: Gemma 3; qwen_vision.cpp: Qwen3.5; gemma4_vision.cpp:
// Gemma 4) share: reading their settings from a config.json or an mmproj GGUF, loading their
// weights, the device backend's per-thread stream, per-image attention on MLX's SDPA, the axial
// rotary's frequencies, and handing the result back as host floats. A tower file keeps only what
// makes its architecture different: its names, its layer and its pooling or merging.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "../core/gguf_file.h"
#include "../core/metadata.h"
#include "../core/model.h"
#include "decoder.h"
#include "linear.h"
#include "siglip.h"

namespace llmd {

namespace mx = mlx::core;

// Each image's patch grid (t, h, w), as VisionTower::encode_patches takes them.
using PatchGrids = std::vector<std::array<int, 3>>;

// A LayerNorm's scale and shift.
struct LayerNormWeights {
  mx::array w{0.f}, b{0.f};
};

// gelu(x): the tanh approximation (gelu_pytorch_tanh) or the exact erf form, in MLX ops (the
// device backend; the host backend has encoder_ops.h's vectorized one).
mx::array gelu(const mx::array& x, bool tanh_approx);
inline mx::array gelu_tanh(const mx::array& x) { return gelu(x, true); }

// Whether a config's `hidden_act` names the tanh-approximated GELU (transformers' three names for it).
bool is_gelu_tanh(const std::string& act);

// The sizes every tower's encoder has: each tower's settings derive from it, with the defaults
// of its transformers config class.
struct EncoderSizes {
  int hidden, ffn, layers, heads;
};

// A tower's settings in a flattened config.json: `prefix` + key ("vision_config.hidden_size"),
// or `fallback` (the transformers config class's default) where the config leaves the key out.
class TowerConfig {
 public:
  explicit TowerConfig(const Metadata& config, std::string prefix = "vision_config.")
      : config_(config), prefix_(std::move(prefix)) {}
  int integer(const std::string& key, int fallback) const;
  // Each (key, field) pair's setting read into the field, the field's value the fallback: a
  // tower's sizes as one table.
  void integers(std::initializer_list<std::pair<const char*, int*>> fields) const;
  // hidden_size, intermediate_size, num_hidden_layers and num_attention_heads.
  void sizes(EncoderSizes& s) const;
  float real(const std::string& key, float fallback) const;
  double real(const std::string& key, double fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  bool flag(const std::string& key, bool fallback) const;

 private:
  const Metadata& config_;
  std::string prefix_;
};

// The first of `prefixes` under which the checkpoint has `probe`; throws naming `what` (and the
// first prefix's tensor) if none: the checkpoints name the same tower under different prefixes.
std::string find_prefix(const Checkpoint& w, const std::vector<std::string>& prefixes, const std::string& probe,
                        const std::string& what);

// A checkpoint directory's tower weights, as every tower loads them: small tensors evaluated
// once at load (not on every encode), linear maps on the host backend through llmd's float GEMM
// (MLX's CPU matmul goes through a BLAS whose threads spin beside llmd's).
class TowerCheckpoint {
 public:
  TowerCheckpoint(const Checkpoint& w, bool on_device) : w_(w), on_device_(on_device) {}
  bool has(const std::string& name) const { return w_.has(name); }
  mx::array get(const std::string& name) const { return w_.get(name); }
  mx::array vec(const std::string& name) const;
  // The modules' weights stacked into one Linear (one module: its own).
  Linear linear(const std::vector<std::string>& modules) const;
  bool on_device() const { return on_device_; }

 private:
  const Checkpoint& w_;
  bool on_device_;
};

// A float weight matrix as a Linear the tower's backend runs (the host float GEMM on the host).
Linear tower_linear(const mx::array& weight, bool on_device);

// llama.cpp's mmproj GGUF of a tower: its `clip.*` settings and `v.*` / `mm.*` tensors, every
// error naming `path`. Throws when the file has no vision encoder (clip.has_vision_encoder).
class MmprojFile {
 public:
  MmprojFile(const GgufFile& file, std::string path);
  const Metadata& metadata() const { return file_.metadata(); }
  // A setting the tower cannot do without.
  int need(const std::string& key) const;
  const TensorView& tensor(const std::string& name) const;
  bool has(const std::string& name) const { return file_.find(name) != nullptr; }
  mx::array vec(const std::string& name) const { return dequantize_tensor(tensor(name)); }
  // The `names` modules' weights (name + ".weight") stacked into one Linear: float32 ones on
  // the float path a checkpoint's take, F16 and quantized blocks kept as stored.
  Linear linear(const std::vector<std::string>& names, bool on_device) const;

 private:
  const GgufFile& file_;
  std::string path_;
};

// Makes the calling thread's MLX default `device`, with a stream of its own: the worker
// encodes on a thread of its own, and MLX's GPU streams belong to the thread that made them
// (as the engine's steps do in DeviceState::prepare).
void use_device_on_this_thread(const mx::Device& device);

// Total patches of `grids`; throws (naming `model`) unless each is a still image (t = 1) whose
// sides divide by `k` (`verb`: "pool", "merge") and, when `max_side` > 0, are at most that.
int grid_patches(const PatchGrids& grids, int k, const std::string& model, const std::string& verb,
                 int max_side = 0);

// The axial 2-D rotary's inverse frequencies: head_dim / 4 per axis, theta^(-4i / head_dim).
std::vector<double> axial_inv_freq(double theta, int head_dim);

// Bidirectional attention within each image, on MLX's SDPA (the device backend): q, k, v
// [patches, heads, head_dim], patches image by image as `grids` lists them -> [patches,
// heads * head_dim]. Queries go in chunks: a released-size image's scores at once (16 heads x
// 16384^2 patches, float32) would be 16 GiB; a chunk's are 2 GiB at most.
mx::array per_image_attention(const mx::array& q, const mx::array& k, const mx::array& v, const PatchGrids& grids,
                              float scale);

// The tower's output rows as host float32, row-major (evaluated here).
std::vector<float> host_rows(const mx::array& x);

// What every tower class holds: its settings, what it tells the engine, and where it runs (the
// default device when it was loaded; `on_device`: the device backend, not llmd's host kernels).
template <class Config>
class TowerBase : public VisionTower {
 public:
  const VisionInfo& info() const override { return info_; }

 protected:
  TowerBase(Config c, VisionInfo info, bool on_device)
      : c_(c), info_(std::move(info)), on_device_(on_device), device_(mx::default_device()) {}
  // First thing in each encode: the device backend's stream for the calling thread.
  void prepare_thread() const {
    if (on_device_) use_device_on_this_thread(device_);
  }

  Config c_;
  VisionInfo info_;
  bool on_device_;
  mx::Device device_;
};

}  // namespace llmd
