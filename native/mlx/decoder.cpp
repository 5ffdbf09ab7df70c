#include "decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "../core/dequantize.h"
#include "compiled_ops.h"
#include "device_sampler.h"
#include "kernels/pack8.h"
#include "kernels/qgemm.h"
#include "mlx/graph_utils.h"

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
  info.context_length = d.context_length;  // the trained context; the engine may serve more or less
  info.n_layers = d.n_layers;
  info.n_heads = d.n_heads;
  info.n_kv_heads = d.n_kv_heads;
  info.head_dim = d.head_dim;
  info.hidden_size = d.hidden_size;
  info.weight_format = format;
  return info;
}

Embedding Embedding::mlx_affine(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits,
                                int group) {
  const auto cpu = mx::default_stream(mx::Device::cpu);
  Embedding e;
  e.dim_ = w.shape(1) * 32 / bits;
  e.bits_ = bits;
  e.group_ = group;
  e.type_ = TensorType::F32;  // unused
  e.bytes_ = mx::contiguous(w, false, cpu);
  e.scales_ = mx::contiguous(mx::astype(scales, mx::float32, cpu), false, cpu);
  e.biases_ = mx::contiguous(mx::astype(biases, mx::float32, cpu), false, cpu);
  mx::eval({e.bytes_, e.scales_, e.biases_});
  return e;
}

Embedding Embedding::tied_to(const Linear& head) {
  Embedding e(head.weight(), head.type(), head.in_features());
  e.packed_ = head.packed();
  return e;
}

void Embedding::lookup(const std::vector<int32_t>& tokens, float* out, float scale) const {
  if (bits_) {
    const size_t rb = static_cast<size_t>(dim_) * bits_ / 8;
    const size_t gpr = dim_ / group_;
    const auto* base = reinterpret_cast<const uint8_t*>(bytes_.data<uint32_t>());
    for (size_t i = 0; i < tokens.size(); ++i) {
      float* row = out + i * dim_;
      const uint8_t* q = base + static_cast<size_t>(tokens[i]) * rb;
      const float* sc = scales_.data<float>() + static_cast<size_t>(tokens[i]) * gpr;
      const float* bi = biases_.data<float>() + static_cast<size_t>(tokens[i]) * gpr;
      for (int j = 0; j < dim_; ++j) {
        const int v = bits_ == 8 ? q[j] : (j & 1 ? q[j / 2] >> 4 : q[j / 2] & 0x0f);
        row[j] = (sc[j / group_] * static_cast<float>(v) + bi[j / group_]) * scale;
      }
    }
    return;
  }
  const size_t rb = row_bytes(type_, dim_);
  const uint8_t* base = bytes_.data<uint8_t>();
  std::vector<uint8_t> unpacked(packed_ ? rb : 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    float* row = out + i * dim_;
    const uint8_t* blocks = base + static_cast<size_t>(tokens[i]) * rb;
    if (packed_) {
      kernels::unpack8_row(type_, base, tokens[i], dim_, unpacked.data(), kernels::active_table().pack_layout);
      blocks = unpacked.data();
    }
    dequantize_row(type_, blocks, row, dim_);
    if (scale != 1.f) {
      for (int j = 0; j < dim_; ++j) row[j] *= scale;
    }
  }
}

mx::array copy_bytes(const TensorView& t) {
  if (SkipWeightBytes::active()) return owned_bytes(0);
  mx::array a = owned_bytes(t.n_bytes);
  std::memcpy(a.data<uint8_t>(), t.data, t.n_bytes);
  return a;
}

Embedding float_embedding(const mx::array& weight) {
  mx::array bytes = mx::view(mx::flatten(mx::astype(weight, mx::float32)), mx::uint8);
  bytes.eval();
  return Embedding(bytes, TensorType::F32, weight.shape(1));
}

Checkpoint::Checkpoint(const std::string& dir, const Metadata* hf) {
  namespace fs = std::filesystem;
  if (hf) {
    // mlx-lm writes `quantization` (and the same under `quantization_config`); a
    // `quant_method` there is another tool's format (GPTQ, AWQ, FP8, ...).
    for (const std::string key : {"quantization", "quantization_config"}) {
      if (auto method = hf->get_string(key + ".quant_method")) {
        throw std::runtime_error("quantization method '" + *method + "' is not supported (llmd runs MLX affine " +
                                 "4/8-bit checkpoints, GGUF, and float safetensors)");
      }
      if (auto mode = hf->get_string(key + ".mode"); mode && *mode != "affine") {
        throw std::runtime_error("MLX quantization mode '" + *mode + "' is not supported (affine only)");
      }
      auto bits = hf->get_int(key + ".bits");
      auto group = hf->get_int(key + ".group_size");
      if (!bits && !group) continue;
      quant_.bits = static_cast<int>(bits.value_or(4));
      quant_.group_size = static_cast<int>(group.value_or(64));
      if (quant_.bits != 4 && quant_.bits != 8) {
        throw std::runtime_error("MLX quantization with " + std::to_string(quant_.bits) +
                                 " bits is not supported (4 or 8 bits)");
      }
      if (quant_.group_size != 32 && quant_.group_size != 64 && quant_.group_size != 128) {
        throw std::runtime_error("MLX quantization group_size " + std::to_string(quant_.group_size) +
                                 " is not supported (32, 64 or 128)");
      }
      // Per-module settings, flattened as "<key>.<module>.bits" / ".group_size".
      const std::string prefix = key + ".";
      for (const auto& [k, v] : hf->values()) {
        for (const std::string field : {".bits", ".group_size"}) {
          if (k.size() <= prefix.size() + field.size() || !k.starts_with(prefix) || !k.ends_with(field)) continue;
          const std::string module = k.substr(prefix.size(), k.size() - prefix.size() - field.size());
          Quantization& q = overrides_.try_emplace(module, quant_).first->second;
          (field == ".bits" ? q.bits : q.group_size) = static_cast<int>(hf->get_int(k).value_or(0));
        }
      }
      for (const auto& [module, q] : overrides_) {
        if (q.bits != 4 && q.bits != 8) {
          throw std::runtime_error("MLX quantization with " + std::to_string(q.bits) + " bits (" + module +
                                   ") is not supported (4 or 8 bits)");
        }
      }
      break;
    }
  }
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
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() && name.ends_with(suffix)) {
    const std::string module = name.substr(0, name.size() - suffix.size());
    if (auto q = quantization(module)) {
      return mx::dequantize(it->second, mx::astype(tensors_.at(module + ".scales"), mx::float32),
                            mx::astype(tensors_.at(module + ".biases"), mx::float32), q->group_size, q->bits, "affine",
                            std::nullopt, mx::float32, mx::default_stream(mx::Device::cpu));
    }
  }
  return mx::astype(it->second, mx::float32);
}

std::optional<Checkpoint::Quantization> Checkpoint::quantization(const std::string& module) const {
  auto w = tensors_.find(module + ".weight");
  auto s = tensors_.find(module + ".scales");
  if (w == tensors_.end() || s == tensors_.end() || !has(module + ".biases")) return std::nullopt;
  if (w->second.dtype() != mx::uint32 || w->second.ndim() < 2 || s->second.ndim() != w->second.ndim()) {
    throw std::runtime_error("tensor " + module + ".weight has scales but is not MLX uint32-packed");
  }
  // mlx-lm may quantize some modules with other settings (named in the config); the bits
  // are checked against the shapes, k = groups * group_size = packed words * 32 / bits.
  auto over = overrides_.find(module);
  const int group = over != overrides_.end() ? over->second.group_size : quant_.group_size ? quant_.group_size : 64;
  if (group != 32 && group != 64 && group != 128) {
    throw std::runtime_error("MLX quantization group_size " + std::to_string(group) + " of " + module +
                             " is not supported (32, 64 or 128)");
  }
  const int64_t k = static_cast<int64_t>(s->second.shape(-1)) * group;
  const int64_t words = w->second.shape(-1);
  if ((words * 32) % k != 0 || (words * 32 / k != 4 && words * 32 / k != 8)) {
    throw std::runtime_error("MLX-quantized tensor " + module + ".weight is not 4- or 8-bit with group_size " +
                             std::to_string(group) + " (llmd runs affine 4/8-bit, group 32/64/128)");
  }
  const int bits = static_cast<int>(words * 32 / k);
  if (over != overrides_.end() && over->second.bits != bits) {
    throw std::runtime_error("MLX-quantized tensor " + module + ".weight is " + std::to_string(bits) +
                             "-bit but the config says " + std::to_string(over->second.bits));
  }
  return Quantization{bits, group};
}

Linear Checkpoint::linear(const std::vector<std::string>& modules, bool on_device, bool interleave_pairs) const {
  std::vector<Linear::MlxQuantized> parts;
  std::optional<Quantization> first;
  bool all = true;
  for (const std::string& m : modules) {
    auto q = quantization(m);
    if (!q || (first && (q->bits != first->bits || q->group_size != first->group_size))) {
      all = false;
      break;
    }
    first = q;
    parts.push_back({tensors_.at(m + ".weight"), tensors_.at(m + ".scales"), tensors_.at(m + ".biases")});
  }
  if (all) return Linear::from_mlx_quantized(parts, first->bits, first->group_size, on_device, interleave_pairs);
  if (std::all_of(modules.begin(), modules.end(), [&](const std::string& m) { return quantization(m).has_value(); })) {
    // mlx-lm's per-module settings differ within the stack: one quantized Linear per run of
    // modules with the same settings (gate and up apart, as a SwiGLU over the concatenation
    // expects).
    auto same = [&](const std::string& a, const std::string& b) {
      return quantization(a)->bits == quantization(b)->bits &&
             quantization(a)->group_size == quantization(b)->group_size;
    };
    std::vector<Linear> pieces;
    for (auto run = modules.begin(); run != modules.end();) {
      auto end = std::find_if(run, modules.end(), [&](const std::string& m) { return !same(m, *run); });
      pieces.push_back(linear({run, end}, on_device));
      run = end;
    }
    return Linear::concatenated(std::move(pieces));
  }
  std::vector<mx::array> ws;
  for (const std::string& m : modules) ws.push_back(get(m + ".weight"));
  return Linear::from_float(ws.size() == 1 ? ws[0] : mx::concatenate(ws, 0), on_device);
}

std::optional<Linear::MlxQuantized> Checkpoint::quantized_parts(const std::string& module) const {
  if (!quantization(module)) return std::nullopt;
  return Linear::MlxQuantized{tensors_.at(module + ".weight"), tensors_.at(module + ".scales"),
                              tensors_.at(module + ".biases")};
}

Embedding Checkpoint::embedding(const std::string& module, const Linear* tied_head) const {
  if (auto q = quantization(module)) {
    if (tied_head && !tied_head->on_device() && tied_head->quantized() && tied_head->type() == TensorType::Q4_1) {
      return Embedding::tied_to(*tied_head);
    }
    return Embedding::mlx_affine(tensors_.at(module + ".weight"), tensors_.at(module + ".scales"),
                                 tensors_.at(module + ".biases"), q->bits, q->group_size);
  }
  return float_embedding(get(module + ".weight"));
}

std::string Checkpoint::format() const {
  if (!quantized()) return "safetensors";
  return "safetensors:mlx-affine" + std::to_string(quant_.bits) + "g" + std::to_string(quant_.group_size);
}

size_t Checkpoint::stored_bytes() const {
  size_t n = 0;
  for (const auto& [name, a] : tensors_) n += a.nbytes();
  return n;
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
  step.device_tokens.clear();
  rows.batch = std::make_shared<AttentionBatch>();
  rows.batch->pool = &pool;
  rows.x.resize(static_cast<size_t>(rows.total) * hidden);
  int row = 0;
  for (const StepSegment& seg : step.segments) {
    const int n = static_cast<int>(seg.tokens.size());
    float* out = rows.x.data() + static_cast<size_t>(row) * hidden;
    if (seg.embeddings.empty()) {
      embed.lookup(seg.tokens, out, embed_scale);
    } else {
      // Embedded rows (images) hold surrogate ids: look up token 0 there, then overwrite.
      std::vector<int32_t> ids = seg.tokens;
      for (int i = 0; i < n; ++i) {
        if (seg.embeddings[i]) ids[i] = 0;
      }
      embed.lookup(ids, out, embed_scale);
      for (int i = 0; i < n; ++i) {
        if (seg.embeddings[i]) std::copy_n(seg.embeddings[i], hidden, out + static_cast<size_t>(i) * hidden);
      }
    }
    rows.batch->segments.push_back({seg.kv, row, n, seg.start_pos, seg.attend_to});
    row += n;
    if (seg.want_logits) {
      for (int r = row - std::clamp(seg.logits_tail, 1, n); r < row; ++r) {
        rows.logit_rows.push_back(r);
        rows.row_samples.push_back(r == row - 1 ? seg.device_sample : std::nullopt);
        if (seg.device_sample) rows.device_tokens = &step.device_tokens;
      }
    }
    if (seg.hidden != HiddenOut::None) rows.hidden_spans.push_back({row - n, n, seg.hidden});
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
  if (!kv_) kv_ = std::make_unique<DeviceKvStore>(shape, &paths_);
  kv_->ensure(pool);
  return *kv_;
}

void DeviceState::copy_kv_block(KvPool& pool, const KvShape& shape, int src, int dst) {
  if (!on_device_) {
    pool.copy_block(src, dst);
    return;
  }
  // The source block was written by an earlier step, so the store exists.
  if (!kv_) kv_ = std::make_unique<DeviceKvStore>(shape, &paths_);
  kv_->copy_block(pool, src, dst);
}

void DeviceState::read_kv_blocks(KvPool& pool, const KvShape& shape, const std::vector<int>& blocks, bool window,
                                 const std::vector<std::byte*>& out) {
  if (!on_device_) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      const std::byte* from = pool.part_data(blocks[i], window);
      std::copy(from, from + pool.part_bytes(window), out[i]);
    }
    return;
  }
  prepare(pool, shape).read_blocks(pool, blocks, window, out);
}

void DeviceState::write_kv_blocks(KvPool& pool, const KvShape& shape, const std::vector<int>& blocks, bool window,
                                  const std::vector<const std::byte*>& in) {
  if (!on_device_) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::copy(in[i], in[i] + pool.part_bytes(window), pool.part_data(blocks[i], window));
    }
    return;
  }
  // A restarted worker's first request may load before any step made the store.
  prepare(pool, shape).write_blocks(pool, blocks, window, in);
}

KvShape decoder_kv_shape(const DecoderDims& d, bool on_device) {
  // The device backend keeps KV in MLX arrays of its compute dtype (device_attention.h); the
  // CPU backend stores float16 in the pool's own blocks (kv_cache.h, KvType).
  const KvType type = !on_device || device_compute_dtype() == mx::float16 ? KvType::F16 : KvType::F32;
  return {d.n_layers, d.n_kv_heads, d.head_dim, !on_device, type};
}

mx::array head_rms_norm(const mx::array& x, const std::optional<mx::array>& weight, int heads, int head_dim, float eps,
                        bool compiled) {
  if (compiled) return rms_norm_heads(x, weight, heads, head_dim, eps);
  const int rows = x.shape(0);
  return mx::reshape(mx::fast::rms_norm(mx::reshape(x, {rows, heads, head_dim}), weight, eps),
                     {rows, heads * head_dim});
}

namespace {
// The graph of the step being built: a device-backend step is evaluated layer by layer
// (start_layer), so its primitives are counted part by part and recorded when it ends.
struct StepGraph {
  std::map<std::string, int> counts;
  std::string dot;
};
thread_local StepGraph t_step_graph;

// Counts the primitives of the graph that evaluating `outputs` runs, by the same rule as
// mx.export_to_dot (one node per primitive, multi-output ones once; evaluated arrays such as
// weights, the KV store and the layers start_layer already began are leaves), so llmd's
// figure and mlx-lm's are comparable.
void count_step_graph(const std::vector<mx::array>& outputs) {
  std::ostringstream dot;
  mx::export_to_dot(dot, outputs);
  const std::string text = dot.str();
  const std::string label = "[label =\"", rect = "shape=rectangle";
  for (size_t at = text.find(label); at != std::string::npos; at = text.find(label, at + 1)) {
    const size_t end = text.find('"', at + label.size());
    const size_t line_end = text.find('\n', at);
    if (end == std::string::npos || text.find(rect, end) > line_end) continue;
    const std::string name = text.substr(at + label.size(), end - at - label.size());
    ++t_step_graph.counts[name];
    ++t_step_graph.counts["total"];
  }
  t_step_graph.dot += text;
}

void record_step_graph(const std::vector<mx::array>& outputs) {
  count_step_graph(outputs);
  if (const char* path = std::getenv("LLMD_STEP_GRAPH_DOT")) std::ofstream(path) << t_step_graph.dot;  // to read it
  OpProfile::record_step_graph(std::move(t_step_graph.counts));
  t_step_graph = {};
}
}  // namespace

std::optional<mx::array> keep_output_rows(StepRows& rows, mx::array& attention_out, mx::array& residual) {
  if (!rows.hidden_spans.empty() || rows.logit_rows.empty()) return std::nullopt;
  // Rows in increasing order, each once (speculative verification reads several rows of a
  // segment; they stay in step order).
  std::vector<int32_t> kept(rows.logit_rows);
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  if (static_cast<int>(kept.size()) >= rows.total) return std::nullopt;
  for (int32_t& r : rows.logit_rows) {
    r = static_cast<int32_t>(std::lower_bound(kept.begin(), kept.end(), r) - kept.begin());
  }
  const mx::array indices(kept.begin(), {static_cast<int>(kept.size())}, mx::int32);
  attention_out = mx::take(attention_out, indices, 0);
  residual = mx::take(residual, indices, 0);
  return indices;
}

void start_layer(const mx::array& x) {
  if (OpProfile::step_graph_recording()) count_step_graph({x});
  mx::async_eval(x);
}

void start_writes(const std::vector<mx::array>& arrays) {
  if (OpProfile::step_graph_recording()) count_step_graph(arrays);
  mx::async_eval(arrays);
}

void compute_logits(const mx::array& x, const std::vector<int32_t>& rows, const Linear& lm_head,
                    const mx::array& norm, float eps, float softcap, std::vector<float>& logits,
                    std::optional<ScopedOpTimer>& build_timer) {
  StepRows step_rows;
  step_rows.logit_rows = rows;
  std::vector<float> unused;
  compute_outputs(x, step_rows, lm_head, norm, eps, softcap, logits, unused, build_timer);
}

void compute_outputs(const mx::array& x, const StepRows& step_rows, const Linear& lm_head, const mx::array& norm,
                     float eps, float softcap, std::vector<float>& logits, std::vector<float>& hidden,
                     std::optional<ScopedOpTimer>& build_timer) {
  const std::vector<int32_t>& rows = step_rows.logit_rows;
  std::vector<mx::array> outputs;
  int logits_at = -1, tokens_at = -1;
  // Rows the device samples (device_sampler.h): only their tokens come back.
  std::vector<int32_t> host_rows, device_rows;
  std::vector<StepSegment::DeviceSample> device_params;
  if (step_rows.device_tokens) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& sample = step_rows.row_samples[i];
      (sample ? device_rows : host_rows).push_back(static_cast<int32_t>(i));
      if (sample) device_params.push_back(*sample);
    }
  }
  auto pick = [](const mx::array& a, const std::vector<int32_t>& idx) {
    const int n = static_cast<int>(idx.size());
    return n == a.shape(0) ? a : mx::take(a, mx::array(idx.begin(), {n}, mx::int32), 0);
  };
  if (!rows.empty()) {
    // Every row sampled (a decode step): no gather.
    bool all_rows = static_cast<int>(rows.size()) == x.shape(0);
    for (size_t i = 0; i < rows.size() && all_rows; ++i) all_rows = rows[i] == static_cast<int32_t>(i);
    mx::array h = all_rows ? x : mx::take(x, mx::array(rows.begin(), {static_cast<int>(rows.size())}, mx::int32), 0);
    mx::array out = lm_head(h, {.rms_norm_weight = norm, .eps = eps});
    out = mx::astype(out, mx::float32);  // cast: the sampler reads float32 logits
    if (softcap > 0.f) out = llmd::softcap(out, softcap);  // compiled_ops.h
    if (device_rows.empty()) {
      logits_at = static_cast<int>(outputs.size());
      outputs.push_back(out);
    } else {
      tokens_at = static_cast<int>(outputs.size());
      outputs.push_back(sample_on_device(pick(out, device_rows), device_params));
      if (!host_rows.empty()) {
        logits_at = static_cast<int>(outputs.size());
        outputs.push_back(pick(out, host_rows));
      }
    }
  }
  if (!step_rows.hidden_spans.empty()) {
    // Embeddings: the final norm over the rows they read (the lm_head fuses it for logits),
    // in float32 whatever the compute dtype, as sentence-transformers pools.
    const int width = x.shape(1);
    std::vector<mx::array> pooled;
    for (const auto& span : step_rows.hidden_spans) {
      const int first = span.mode == HiddenOut::Last ? span.first + span.n - 1 : span.first;
      mx::array h = mx::astype(mx::slice(x, {first, 0}, {span.first + span.n, width}), mx::float32);
      h = mx::fast::rms_norm(h, mx::astype(norm, mx::float32), eps);
      pooled.push_back(span.mode == HiddenOut::Sum ? mx::sum(h, 0, true) : h);
    }
    outputs.push_back(pooled.size() == 1 ? pooled[0] : mx::concatenate(pooled, 0));
  }
  build_timer.reset();
  if (outputs.empty()) {
    if (OpProfile::step_graph_recording()) record_step_graph({x});
    mx::eval(x);
    logits.clear();
    hidden.clear();
    return;
  }
  if (OpProfile::step_graph_recording()) record_step_graph(outputs);
  mx::eval(outputs);
  if (logits_at >= 0) {
    const mx::array& out = outputs[logits_at];
    logits.resize(out.size());
    std::memcpy(logits.data(), out.data<float>(), out.nbytes());
  } else {
    logits.clear();
  }
  if (tokens_at >= 0) {
    const int32_t* tokens = outputs[tokens_at].data<int32_t>();
    step_rows.device_tokens->assign(rows.size(), -1);
    for (size_t i = 0; i < device_rows.size(); ++i) (*step_rows.device_tokens)[device_rows[i]] = tokens[i];
  }
  if (!step_rows.hidden_spans.empty()) {
    const mx::array& out = outputs.back();
    hidden.resize(out.size());
    std::memcpy(hidden.data(), out.data<float>(), out.nbytes());
  } else {
    hidden.clear();
  }
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
