#include "decoder.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "../core/dequantize.h"

namespace llmd {

void DecoderDims::check(const std::string& arch) const {
  if (n_layers <= 0 || hidden_size <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 ||
      head_dim <= 0 || ffn_size <= 0 || vocab_size <= 0) {
    throw std::runtime_error("inconsistent " + arch + " hyperparameters in model metadata");
  }
  if (head_dim % 16 != 0) {
    throw std::runtime_error(arch + " head_dim " + std::to_string(head_dim) +
                             " is not supported (llmd's attention needs a multiple of 16)");
  }
}

ModelInfo make_info(const DecoderDims& d, const std::string& arch, const std::string& format,
                    const LoadOptions& options) {
  ModelInfo info;
  info.architecture = arch;
  info.vocab_size = d.vocab_size;
  info.context_length = d.context_length;
  if (options.context_length > 0) info.context_length = std::min(info.context_length, options.context_length);
  info.n_layers = d.n_layers;
  info.n_heads = d.n_heads;
  info.n_kv_heads = d.n_kv_heads;
  info.head_dim = d.head_dim;
  info.hidden_size = d.hidden_size;
  info.weight_format = format;
  return info;
}

void Embedding::lookup(const std::vector<int32_t>& tokens, float* out, float scale) const {
  const size_t rb = row_bytes(type_, dim_);
  const uint8_t* base = bytes_.data<uint8_t>();
  for (size_t i = 0; i < tokens.size(); ++i) {
    float* row = out + i * dim_;
    dequantize_row(type_, base + static_cast<size_t>(tokens[i]) * rb, row, dim_);
    if (scale != 1.f) {
      for (int j = 0; j < dim_; ++j) row[j] *= scale;
    }
  }
}

mx::array copy_bytes(const TensorView& t) {
  mx::array a = owned_bytes(t.n_bytes);
  std::memcpy(a.data<uint8_t>(), t.data, t.n_bytes);
  return a;
}

Embedding float_embedding(const mx::array& weight) {
  mx::array bytes = mx::view(mx::flatten(mx::astype(weight, mx::float32)), mx::uint8);
  bytes.eval();
  return Embedding(bytes, TensorType::F32, weight.shape(1));
}

Checkpoint::Checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") {
      auto loaded = mx::load_safetensors(entry.path().string(), mx::default_stream(mx::Device::cpu));
      for (auto& [name, arr] : loaded.first) tensors_.insert_or_assign(name, arr);
    }
  }
  if (tensors_.empty()) throw std::runtime_error(dir + " holds no .safetensors files");
}

mx::array Checkpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error("checkpoint has no tensor '" + name + "'");
  return mx::astype(it->second, mx::float32);
}

std::optional<mx::array> Checkpoint::find(const std::string& name) const {
  if (!has(name)) return std::nullopt;
  return get(name);
}

double hf_rope_theta(const Metadata& hf, double fallback, const std::string& layer_type) {
  if (!layer_type.empty()) {
    if (auto t = hf.get_float("rope_parameters." + layer_type + ".rope_theta")) return *t;
  }
  if (auto t = hf.get_float("rope_parameters.rope_theta")) return *t;
  return hf.get_float("rope_theta").value_or(fallback);
}

std::pair<std::string, double> hf_rope_scaling(const Metadata& hf, const std::string& layer_type) {
  for (const std::string prefix : {layer_type.empty() ? std::string() : "rope_parameters." + layer_type + ".",
                                   std::string("rope_parameters."), std::string("rope_scaling.")}) {
    if (prefix.empty()) continue;
    auto type = hf.get_string(prefix + "rope_type");
    if (!type) type = hf.get_string(prefix + "type");
    if (type) return {*type == "default" ? "" : *type, hf.get_float(prefix + "factor").value_or(1.0)};
  }
  return {"", 1.0};
}

StepRows embed_step(const Step& step, KvPool& pool, const Embedding& embed, int hidden, float embed_scale) {
  StepRows rows;
  rows.total = step.total_tokens();
  rows.batch = std::make_shared<AttentionBatch>();
  rows.batch->pool = &pool;
  rows.x.resize(static_cast<size_t>(rows.total) * hidden);
  int row = 0;
  for (const StepSegment& seg : step.segments) {
    const int n = static_cast<int>(seg.tokens.size());
    embed.lookup(seg.tokens, rows.x.data() + static_cast<size_t>(row) * hidden, embed_scale);
    rows.batch->segments.push_back({seg.kv, row, n, seg.start_pos});
    row += n;
    if (seg.want_logits) rows.logit_rows.push_back(row - 1);
  }
  return rows;
}

DeviceKvStore& DeviceState::prepare(KvPool& pool, const KvShape& shape) {
  mx::set_default_device(device_);  // the engine thread builds this step's graph
  // MLX's GPU streams belong to the thread that made them: give each thread that runs steps
  // (the engine's, or a caller of score()) a stream of its own.
  thread_local bool has_stream = false;
  if (!has_stream) {
    mx::set_default_stream(mx::new_stream(device_));
    has_stream = true;
  }
  if (!kv_) kv_ = std::make_unique<DeviceKvStore>(shape);
  kv_->ensure(pool);
  return *kv_;
}

void DeviceState::copy_kv_block(KvPool& pool, const KvShape& shape, int src, int dst) {
  if (!on_device_) {
    pool.copy_block(src, dst);
    return;
  }
  // The source block was written by an earlier step, so the store exists.
  if (!kv_) kv_ = std::make_unique<DeviceKvStore>(shape);
  kv_->copy_block(pool, src, dst);
}

KvShape decoder_kv_shape(const DecoderDims& d, bool on_device) {
  // The device backend keeps KV in MLX arrays of its compute dtype (device_attention.h).
  return {d.n_layers, d.n_kv_heads, d.head_dim, !on_device,
          on_device ? static_cast<int>(mx::size_of(device_compute_dtype())) : 4};
}

mx::array head_rms_norm(const mx::array& x, const mx::array& weight, int heads, int head_dim, float eps) {
  const int rows = x.shape(0);
  return mx::reshape(mx::fast::rms_norm(mx::reshape(x, {rows, heads, head_dim}), weight, eps),
                     {rows, heads * head_dim});
}

void compute_logits(const mx::array& x, const std::vector<int32_t>& rows, const Linear& lm_head,
                    const mx::array& norm, float eps, float softcap, std::vector<float>& logits,
                    std::optional<ScopedOpTimer>& build_timer) {
  if (rows.empty()) {
    build_timer.reset();
    mx::eval(x);
    logits.clear();
    return;
  }
  mx::array idx(rows.begin(), {static_cast<int>(rows.size())}, mx::int32);
  mx::array out = lm_head(mx::take(x, idx, 0), {.rms_norm_weight = norm, .eps = eps});
  out = mx::astype(out, mx::float32);
  if (softcap > 0.f) {
    out = mx::multiply(mx::tanh(mx::multiply(out, mx::array(1.f / softcap))), mx::array(softcap));
  }
  build_timer.reset();
  mx::eval(out);
  logits.resize(out.size());
  std::memcpy(logits.data(), out.data<float>(), out.nbytes());
}

std::vector<bool> sliding_pattern(int n_layers, int pattern) {
  std::vector<bool> sliding(n_layers);
  for (int i = 0; i < n_layers; ++i) sliding[i] = pattern > 0 && (i + 1) % pattern != 0;
  return sliding;
}

std::vector<bool> hf_sliding_layers(const Metadata& hf, int n_layers, int default_pattern, const std::string& arch) {
  if (!hf.has("layer_types.0")) {
    return sliding_pattern(n_layers, static_cast<int>(hf.get_int("sliding_window_pattern").value_or(default_pattern)));
  }
  std::vector<bool> sliding;
  for (int i = 0; hf.has("layer_types." + std::to_string(i)); ++i) {
    const std::string t = *hf.get_string("layer_types." + std::to_string(i));
    if (t != "sliding_attention" && t != "full_attention") {
      throw std::runtime_error(arch + " layer type '" + t + "' is not supported");
    }
    sliding.push_back(t == "sliding_attention");
  }
  if (static_cast<int>(sliding.size()) != n_layers) {
    throw std::runtime_error(arch + " layer_types has " + std::to_string(sliding.size()) + " entries for " +
                             std::to_string(n_layers) + " layers");
  }
  return sliding;
}

void require_gelu_tanh(const Metadata& hf, const std::string& arch) {
  const std::string act = hf.get_string("hidden_activation").value_or("gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh") {
    throw std::runtime_error(arch + " hidden_activation '" + act + "' is not supported (expected gelu_pytorch_tanh)");
  }
}

}  // namespace llmd
