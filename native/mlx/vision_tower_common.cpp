#include "vision_tower_common.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace llmd {

mx::array gelu(const mx::array& x, bool tanh_approx) {
  if (tanh_approx) {
    const float c = std::sqrt(2.f / static_cast<float>(M_PI));
    mx::array cube = mx::multiply(mx::multiply(x, x), x);
    mx::array inner = mx::multiply(mx::array(c), mx::add(x, mx::multiply(mx::array(0.044715f), cube)));
    return mx::multiply(mx::multiply(mx::array(0.5f), x), mx::add(mx::array(1.f), mx::tanh(inner)));
  }
  mx::array e = mx::erf(mx::multiply(x, mx::array(static_cast<float>(M_SQRT1_2))));
  return mx::multiply(mx::multiply(mx::array(0.5f), x), mx::add(mx::array(1.f), e));
}

bool is_gelu_tanh(const std::string& act) {
  return act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast";
}

int TowerConfig::integer(const std::string& key, int fallback) const {
  return static_cast<int>(config_.get_int(prefix_ + key).value_or(fallback));
}

void TowerConfig::integers(std::initializer_list<std::pair<const char*, int*>> fields) const {
  for (const auto& [key, field] : fields) *field = integer(key, *field);
}

void TowerConfig::sizes(EncoderSizes& s) const {
  integers({{"hidden_size", &s.hidden},
            {"intermediate_size", &s.ffn},
            {"num_hidden_layers", &s.layers},
            {"num_attention_heads", &s.heads}});
}

float TowerConfig::real(const std::string& key, float fallback) const {
  return static_cast<float>(config_.get_float(prefix_ + key).value_or(fallback));
}

double TowerConfig::real(const std::string& key, double fallback) const {
  return config_.get_float(prefix_ + key).value_or(fallback);
}

std::string TowerConfig::text(const std::string& key, const std::string& fallback) const {
  return config_.get_string(prefix_ + key).value_or(fallback);
}

bool TowerConfig::flag(const std::string& key, bool fallback) const {
  return config_.get_bool(prefix_ + key).value_or(fallback);
}

std::string find_prefix(const Checkpoint& w, const std::vector<std::string>& prefixes, const std::string& probe,
                        const std::string& what) {
  for (const std::string& p : prefixes) {
    if (w.has(p + probe)) return p;
  }
  throw std::runtime_error("this checkpoint has no " + what + " (no tensor '" + prefixes.front() + probe + "')");
}

mx::array TowerCheckpoint::vec(const std::string& name) const {
  mx::array a = w_.get(name);
  a.eval();
  return a;
}

Linear TowerCheckpoint::linear(const std::vector<std::string>& modules) const {
  Linear l = w_.linear(modules, on_device_);
  if (!on_device_) l.use_host_float_gemm();
  return l;
}

Linear tower_linear(const mx::array& weight, bool on_device) {
  Linear l = Linear::from_float(weight, on_device);
  if (!on_device) l.use_host_float_gemm();
  return l;
}

MmprojFile::MmprojFile(const GgufFile& file, std::string path) : file_(file), path_(std::move(path)) {
  if (!file_.metadata().get_bool("clip.has_vision_encoder").value_or(false)) {
    throw std::runtime_error(path_ + " has no vision encoder (clip.has_vision_encoder)");
  }
}

int MmprojFile::need(const std::string& key) const {
  const std::optional<int64_t> x = file_.metadata().get_int(key);
  if (!x) throw std::runtime_error(path_ + " lacks '" + key + "'");
  return static_cast<int>(*x);
}

const TensorView& MmprojFile::tensor(const std::string& name) const {
  const TensorView* x = file_.find(name);
  if (!x) throw std::runtime_error(path_ + " has no tensor '" + name + "'");
  return *x;
}

Linear MmprojFile::linear(const std::vector<std::string>& names, bool on_device) const {
  std::vector<const TensorView*> parts;
  for (const std::string& n : names) parts.push_back(&tensor(n + ".weight"));
  if (parts[0]->type == TensorType::F32) {  // float weights: the host GEMM, as a checkpoint's
    std::vector<mx::array> rows;
    for (const TensorView* p : parts) rows.push_back(dequantize_tensor(*p));
    return tower_linear(rows.size() == 1 ? rows[0] : mx::concatenate(rows, 0), on_device);
  }
  return Linear::from_gguf(parts, false, on_device);  // F16 / quantized blocks stay as stored
}

void use_device_on_this_thread(const mx::Device& device) {
  mx::set_default_device(device);
  thread_local bool has_stream = false;
  if (!has_stream) {
    mx::set_default_stream(mx::new_stream(device));
    has_stream = true;
  }
}

int grid_patches(const PatchGrids& grids, int k, const std::string& model, const std::string& verb, int max_side) {
  int n = 0;
  for (const auto& [t, h, w] : grids) {
    if (t != 1) throw std::invalid_argument(model + " vision: only still images (grid t = 1), not video");
    const std::string grid = std::to_string(h) + "x" + std::to_string(w);
    if (h <= 0 || w <= 0 || h % k != 0 || w % k != 0) {
      throw std::invalid_argument(model + " vision: a patch grid of " + grid + " does not " + verb + " " +
                                  std::to_string(k) + "x" + std::to_string(k));
    }
    if (max_side > 0 && (h > max_side || w > max_side)) {
      throw std::invalid_argument(model + " vision: a patch grid of " + grid + " exceeds the position table's " +
                                  std::to_string(max_side) + " a side");
    }
    n += h * w;
  }
  return n;
}

std::vector<double> axial_inv_freq(double theta, int head_dim) {
  std::vector<double> inv_freq;
  for (int i = 0; i < head_dim / 4; ++i) {
    inv_freq.push_back(std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(head_dim / 2)));
  }
  return inv_freq;
}

mx::array per_image_attention(const mx::array& q, const mx::array& k, const mx::array& v, const PatchGrids& grids,
                              float scale) {
  constexpr int kQueryRows = 2048;  // queries per chunk
  const int H = q.shape(1), hd = q.shape(2);
  std::vector<mx::array> outs;
  int at = 0;
  for (const auto& g : grids) {
    const int n = g[1] * g[2];
    auto part = [&](const mx::array& t) {
      return mx::expand_dims(mx::transpose(mx::slice(t, {at, 0, 0}, {at + n, H, hd}), {1, 0, 2}), 0);
    };
    const mx::array qi = part(q), ki = part(k), vi = part(v);
    std::vector<mx::array> chunks;
    for (int r0 = 0; r0 < n; r0 += kQueryRows) {
      const int r1 = std::min(n, r0 + kQueryRows);
      chunks.push_back(mx::fast::scaled_dot_product_attention(
          n > kQueryRows ? mx::slice(qi, {0, 0, r0, 0}, {1, H, r1, hd}) : qi, ki, vi, scale));
    }
    mx::array a = chunks.size() == 1 ? chunks[0] : mx::concatenate(chunks, 2);
    outs.push_back(mx::reshape(mx::transpose(mx::squeeze(a, 0), {1, 0, 2}), {n, H * hd}));
    at += n;
  }
  return outs.size() == 1 ? outs[0] : mx::concatenate(outs, 0);
}

std::vector<float> host_rows(const mx::array& x) {
  mx::array y = mx::contiguous(mx::astype(x, mx::float32));
  y.eval();
  return std::vector<float>(y.data<float>(), y.data<float>() + y.size());
}

}  // namespace llmd
