// Encoder families (embedding models): BERT (BGE, MiniLM), XLM-RoBERTa and nomic-bert. Every
// position attends to every other (bidirectional), so a prompt runs whole in one step and needs
// no KV cache: the engine feeds whole prompts to a bidirectional() model and never reuses a
// cached prefix. The layers are post-LayerNorm:
//   x = LN(x + attn(x)); x = LN(x + ffn(x))
// BERT / XLM-RoBERTa: learned absolute positions and token-type embeddings added to the token
// embeddings, then a LayerNorm; q/k/v with biases; a GELU (erf) MLP with biases. XLM-RoBERTa
// numbers positions from padding_idx + 1 (RoBERTa's create_position_ids_from_input_ids) in
// Hugging Face checkpoints; llama.cpp's converter drops those rows, so its `bert` GGUF files
// start at 0. nomic-bert: rotary positions (NEOX halves), a fused Wqkv, a SwiGLU MLP, and
// biases only where its config asks for them.
//
// Cross-encoder rerankers (bge-reranker: XLM-RoBERTa with a classification head; llama.cpp's
// `bert` GGUF files with pooling_type rank and cls / cls.output tensors) score a (query,
// document) pair from the CLS row: out(tanh(dense(h_cls))), applied to the pooled row
// (project_pooled). Where the model has several token types, the document's tokens (after the
// first separator) are type 1, as the tokenizer's pair encoding marks them.
#include <cmath>
#include <optional>
#include <stdexcept>

#include "../core/op_profile.h"
#include "architectures.h"
#include "decoder.h"
#include "encoder_ops.h"

namespace llmd {

namespace {

struct EncoderConfig {
  DecoderDims dims;  // n_kv_heads == n_heads; rms_eps holds the LayerNorm epsilon
  int type_vocab = 0;     // token-type rows (0: none); every input is type 0 ("sentence A")
  int position_offset = 0;  // first position id (XLM-RoBERTa safetensors: padding_idx + 1)
  bool rotary = false;    // nomic-bert: RoPE instead of learned positions
  float rope_base = 10000.f;
  bool swiglu = false;    // nomic-bert's MLP: down(silu(gate) * up)
  bool gelu_tanh = false;  // hidden_act gelu_new / gelu_pytorch_tanh (else erf GELU)
};

struct LayerNorm {
  mx::array w{0.f}, b{0.f};
  mx::array operator()(const mx::array& x, float eps) const { return mx::fast::layer_norm(x, w, b, eps); }
};

struct EncoderLayer {
  Linear qkv;
  std::optional<mx::array> qkv_bias;
  Linear wo;
  std::optional<mx::array> wo_bias;
  LayerNorm attn_norm;
  Linear up;  // [gate|up] pairs interleaved when swiglu (Linear's fused SwiGLU)
  std::optional<mx::array> up_bias;
  Linear down;
  std::optional<mx::array> down_bias;
  LayerNorm out_norm;
};

// A sequence-classification head on the CLS row (cross-encoders): optional dense + tanh, then
// the output rows (one per label; rerankers have one). Float32, applied on the host.
struct ClassifierHead {
  std::vector<float> dense_w, dense_b;  // [hidden, hidden], [hidden]; empty: no dense layer
  std::vector<float> out_w, out_b;      // [labels, hidden], [labels]
  int labels = 0;

  void apply(std::vector<float>& v) const {
    const size_t h = v.size();
    if (!dense_w.empty()) {
      std::vector<float> y(h);
      for (size_t i = 0; i < h; ++i) {
        double acc = dense_b[i];
        for (size_t j = 0; j < h; ++j) acc += static_cast<double>(dense_w[i * h + j]) * v[j];
        y[i] = static_cast<float>(std::tanh(acc));
      }
      v = std::move(y);
    }
    std::vector<float> out(labels);
    for (int i = 0; i < labels; ++i) {
      double acc = out_b[i];
      for (size_t j = 0; j < h; ++j) acc += static_cast<double>(out_w[i * h + j]) * v[j];
      out[i] = static_cast<float>(acc);
    }
    v = std::move(out);
  }
};

std::vector<float> host_floats(const mx::array& a) {
  mx::array f = mx::contiguous(mx::astype(a, mx::float32));
  f.eval();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.size());
}

// What every encoder keeps besides its layers.
struct EncoderWeights {
  Embedding tokens;
  std::optional<mx::array> positions;  // [n_positions, hidden] float32 (absolute positions)
  std::optional<mx::array> type0;      // [hidden]: the token-type-0 row
  std::optional<mx::array> type1;      // [hidden]: type 1, for the second text of a pair (cross-encoders)
  int sep_token = -1;                  // the separator ending the first text of a pair
  std::optional<ClassifierHead> head;
  LayerNorm embed_norm;
  std::vector<EncoderLayer> layers;
};

mx::array add_bias(const mx::array& x, const std::optional<mx::array>& b) { return b ? mx::add(x, *b) : x; }

mx::array gelu(const mx::array& x, bool tanh_approx) {
  if (tanh_approx) {
    const float c = std::sqrt(2.f / static_cast<float>(M_PI));
    mx::array inner = mx::multiply(mx::add(x, mx::multiply(mx::array(0.044715f), mx::power(x, mx::array(3.f)))),
                                   mx::array(c));
    return mx::multiply(mx::multiply(mx::array(0.5f), x), mx::add(mx::array(1.f), mx::tanh(inner)));
  }
  return mx::multiply(mx::multiply(mx::array(0.5f), x),
                      mx::add(mx::array(1.f), mx::erf(mx::multiply(x, mx::array(static_cast<float>(M_SQRT1_2))))));
}

class EncoderModel : public Model {
 public:
  EncoderModel(EncoderConfig c, ModelInfo info, EncoderWeights w, bool on_device)
      : c_(c), info_(std::move(info)), w_(std::move(w)), on_device_(on_device) {
    // As the decoders: on the device backend the vectors meeting activations are in the
    // compute dtype (else MLX promotes every op back to float32).
    std::vector<mx::array> all;
    auto convert = [&](mx::array& a) {
      if (on_device_) a = mx::astype(a, device_compute_dtype(), mx::default_stream(mx::Device::cpu));
      all.push_back(a);
    };
    auto convert_opt = [&](std::optional<mx::array>& a) {
      if (a) convert(*a);
    };
    convert(w_.embed_norm.w);
    convert(w_.embed_norm.b);
    for (EncoderLayer& L : w_.layers) {
      if (!on_device_) {
        for (Linear* lin : {&L.qkv, &L.wo, &L.up, &L.down}) lin->use_host_float_gemm();
      }
      for (auto* v : {&L.qkv_bias, &L.wo_bias, &L.up_bias, &L.down_bias}) convert_opt(*v);
      for (auto* n : {&L.attn_norm, &L.out_norm}) {
        convert(n->w);
        convert(n->b);
      }
    }
    if (w_.positions) all.push_back(*w_.positions);
    if (w_.type0) all.push_back(*w_.type0);
    if (w_.type1) all.push_back(*w_.type1);
    mx::eval(all);
    if (c_.rotary) {
      auto rope = std::make_shared<Rope>();
      rope->dims = c_.dims.head_dim;
      rope->interleaved = false;  // NEOX halves, as mx::fast::rope(traditional = false)
      rope->inv_freq = rope_inv_freq(rope->dims, c_.rope_base);
      rope_ = std::move(rope);
    }
  }

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }
  // No KV is kept: a one-element shape without host storage gives the engine's per-sequence
  // bookkeeping something to count and allocates nothing.
  KvShape kv_shape() const override {
    return KvShape{.n_layers = 1, .n_kv_heads = 1, .head_dim = 1, .host_storage = false};
  }
  bool bidirectional() const override { return true; }
  bool supports_hidden() const override { return true; }
  void project_pooled(std::vector<float>& values) const override {
    if (w_.head) w_.head->apply(values);
  }

  std::map<std::string, std::string> matmul_paths() const override {
    std::map<std::string, std::string> paths;
    for (size_t i = 0; i < w_.layers.size(); ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      const EncoderLayer& L = w_.layers[i];
      paths[p + "attn_qkv"] = L.qkv.path();
      paths[p + "attn_output"] = L.wo.path();
      paths[p + (c_.swiglu ? "ffn_gate_up" : "ffn_up")] = L.up.path();
      paths[p + "ffn_down"] = L.down.path();
    }
    return paths;
  }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::vector<float> hidden;
    forward(step, pool, logits, hidden);
  }

  void forward(const Step& step, KvPool& /*pool*/, std::vector<float>& logits, std::vector<float>& hidden) override {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const int H = c_.dims.hidden_size;
    std::vector<int32_t> tokens;
    std::vector<int32_t> positions;
    std::vector<float> second;  // 1 for the second text of a pair (after the first separator)
    std::vector<std::pair<int, int>> spans;  // (first row, rows) of each segment
    for (const StepSegment& s : step.segments) {
      if (s.want_logits) throw std::runtime_error(info_.architecture + " is an encoder: it has no next-token logits");
      if (s.start_pos != 0) throw std::runtime_error(info_.architecture + " runs whole prompts only");
      spans.emplace_back(static_cast<int>(tokens.size()), static_cast<int>(s.tokens.size()));
      bool after_sep = false;
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        tokens.push_back(s.tokens[i]);
        positions.push_back(c_.position_offset + static_cast<int>(i));
        second.push_back(after_sep ? 1.f : 0.f);
        after_sep = after_sep || s.tokens[i] == w_.sep_token;
      }
    }
    const int T = static_cast<int>(tokens.size());
    std::vector<float> rows(static_cast<size_t>(T) * H);
    w_.tokens.lookup(tokens, rows.data());
    mx::array x(rows.begin(), {T, H}, mx::float32);
    if (w_.type0) x = mx::add(x, *w_.type0);
    if (w_.type1) {  // rows of the second text: type 1 instead of type 0
      mx::array is_second(second.begin(), {T, 1}, mx::float32);
      x = mx::add(x, mx::multiply(is_second, mx::subtract(*w_.type1, *w_.type0)));
    }
    if (w_.positions) {
      x = mx::add(x, mx::take(*w_.positions, mx::array(positions.begin(), {T}, mx::int32), 0));
    }
    if (on_device_) x = mx::astype(x, device_compute_dtype());
    const float eps = c_.dims.rms_eps;
    if (!on_device_ && supports_encoder_attention(c_.dims.head_dim)) {
      // The host backend: llmd's threaded, vectorized primitives between the matmuls
      // (encoder_ops.h), attention over all inputs in one op.
      const auto packed = std::make_shared<const EncoderSpans>(spans);
      x = add_layer_norm(x, std::nullopt, std::nullopt, w_.embed_norm.w, w_.embed_norm.b, eps);
      for (const EncoderLayer& L : w_.layers) {
        mx::array a = encoder_attention(L.qkv(x), L.qkv_bias, packed, c_.dims.n_heads, c_.dims.head_dim, rope_);
        x = add_layer_norm(L.wo(a), L.wo_bias, x, L.attn_norm.w, L.attn_norm.b, eps);
        mx::array h = c_.swiglu ? L.up(x, {.swiglu = true}) : bias_gelu(L.up(x), L.up_bias, c_.gelu_tanh);
        x = add_layer_norm(L.down(h), L.down_bias, x, L.out_norm.w, L.out_norm.b, eps);
      }
    } else {
      x = device_layers(x, spans, eps);
    }
    // The pooled rows, float32 (as sentence-transformers pools), one per segment that asked.
    std::vector<mx::array> pooled;
    for (size_t i = 0; i < step.segments.size(); ++i) {
      const HiddenOut mode = step.segments[i].hidden;
      if (mode == HiddenOut::None) continue;
      const auto [first, n] = spans[i];
      const int from = mode == HiddenOut::Last ? first + n - 1 : first;
      const int to = mode == HiddenOut::Sum ? first + n : from + 1;
      mx::array h = mx::astype(mx::slice(x, {from, 0}, {to, H}), mx::float32);
      pooled.push_back(mode == HiddenOut::Sum ? mx::sum(h, 0, true) : h);
    }
    build_timer.reset();
    logits.clear();
    hidden.clear();
    if (pooled.empty()) return;  // nothing to return: nothing worth evaluating
    mx::array out = pooled.size() == 1 ? pooled[0] : mx::concatenate(pooled, 0);
    out.eval();
    hidden.assign(out.data<float>(), out.data<float>() + out.size());
  }

 private:
  // The layers as MLX ops (the device backend, or head sizes the host kernels do not take).
  mx::array device_layers(mx::array x, const std::vector<std::pair<int, int>>& spans, float eps) const {
    x = w_.embed_norm(x, eps);
    for (const EncoderLayer& L : w_.layers) {
      mx::array qkv = add_bias(L.qkv(x), L.qkv_bias);
      mx::array a = attention(qkv, spans);
      x = L.attn_norm(add_bias(L.wo(a, {.residual = x}), L.wo_bias), eps);
      mx::array h = c_.swiglu ? L.up(x, {.swiglu = true}) : gelu(add_bias(L.up(x), L.up_bias), c_.gelu_tanh);
      x = L.out_norm(add_bias(L.down(h, {.residual = x}), L.down_bias), eps);
    }
    return x;
  }

  // Full (unmasked) attention within each segment; segments never see one another.
  mx::array attention(const mx::array& qkv, const std::vector<std::pair<int, int>>& spans) const {
    const int heads = c_.dims.n_heads, hd = c_.dims.head_dim, width = heads * hd;
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    std::vector<mx::array> outs;
    for (const auto& [first, n] : spans) {
      auto part = [&](int which) {
        mx::array t = mx::slice(qkv, {first, which * width}, {first + n, (which + 1) * width});
        t = mx::transpose(mx::reshape(t, {1, n, heads, hd}), {0, 2, 1, 3});
        if (c_.rotary && which < 2) t = mx::fast::rope(t, hd, false, c_.rope_base, 1.f, 0);
        return t;
      };
      mx::array o = mx::fast::scaled_dot_product_attention(part(0), part(1), part(2), scale);
      outs.push_back(mx::reshape(mx::transpose(o, {0, 2, 1, 3}), {n, width}));
    }
    return outs.size() == 1 ? outs[0] : mx::concatenate(outs, 0);
  }

  EncoderConfig c_;
  ModelInfo info_;
  EncoderWeights w_;
  bool on_device_;
  std::shared_ptr<const Rope> rope_;  // nomic-bert on the host backend
};

void check_config(const EncoderConfig& c, const std::string& arch) {
  const DecoderDims& d = c.dims;
  if (d.n_layers <= 0 || d.hidden_size <= 0 || d.n_heads <= 0 || d.hidden_size % d.n_heads != 0 ||
      d.ffn_size <= 0 || d.vocab_size <= 0 || d.context_length <= 0) {
    throw std::runtime_error("inconsistent " + arch + " hyperparameters in model metadata");
  }
}

// ---- GGUF (llama.cpp's converter: architectures `bert` and `nomic-bert`) ----

std::optional<mx::array> gguf_opt(const GgufFile& file, const std::string& name) {
  const TensorView* t = file.find(name);
  if (!t) return std::nullopt;
  return dequantize_tensor(*t);
}

LayerNorm gguf_norm(const GgufFile& file, const std::string& name) {
  return {dequantize_tensor(file.tensor(name + ".weight")), dequantize_tensor(file.tensor(name + ".bias"))};
}

std::unique_ptr<Model> load_encoder_gguf(const GgufFile& file, const LoadOptions& options, const std::string& arch,
                                         bool nomic) {
  const Metadata& m = file.metadata();
  const std::string p = arch + ".";
  if (m.get_bool(p + "attention.causal").value_or(false)) {
    throw std::runtime_error(arch + " with causal attention is not supported");
  }
  EncoderConfig c;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(m.require_int(p + "block_count"));
  d.hidden_size = static_cast<int>(m.require_int(p + "embedding_length"));
  d.ffn_size = static_cast<int>(m.require_int(p + "feed_forward_length"));
  d.n_heads = static_cast<int>(m.require_int(p + "attention.head_count"));
  d.n_kv_heads = d.n_heads;
  d.head_dim = d.n_heads > 0 ? d.hidden_size / d.n_heads : 0;
  d.rms_eps = static_cast<float>(m.get_float(p + "attention.layer_norm_epsilon").value_or(1e-12));
  d.context_length = static_cast<int>(m.require_int(p + "context_length"));
  const TensorView& embd = file.tensor("token_embd.weight");
  d.vocab_size = static_cast<int>(embd.shape[1]);
  check_config(c, arch);
  c.rotary = nomic;
  c.swiglu = nomic;
  if (nomic) c.rope_base = static_cast<float>(m.get_float(p + "rope.freq_base").value_or(10000.0));

  const bool dev = options.on_device();
  EncoderWeights w;
  w.tokens = Embedding(copy_bytes(embd), embd.type, d.hidden_size);
  if (!nomic) w.positions = dequantize_tensor(file.tensor("position_embd.weight"));
  if (auto types = gguf_opt(file, "token_types.weight")) {
    c.type_vocab = types->shape(0);
    w.type0 = mx::reshape(mx::slice(*types, {0, 0}, {1, d.hidden_size}), {d.hidden_size});
  }
  w.embed_norm = gguf_norm(file, "token_embd_norm");
  w.layers.resize(d.n_layers);
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    EncoderLayer& L = w.layers[i];
    if (const TensorView* qkv = file.find(b + "attn_qkv.weight")) {
      L.qkv = Linear::from_gguf({qkv}, false, dev);
      L.qkv_bias = gguf_opt(file, b + "attn_qkv.bias");
    } else {
      L.qkv = Linear::from_gguf({&file.tensor(b + "attn_q.weight"), &file.tensor(b + "attn_k.weight"),
                                 &file.tensor(b + "attn_v.weight")},
                                false, dev);
      if (file.find(b + "attn_q.bias")) {
        L.qkv_bias = mx::concatenate({dequantize_tensor(file.tensor(b + "attn_q.bias")),
                                      dequantize_tensor(file.tensor(b + "attn_k.bias")),
                                      dequantize_tensor(file.tensor(b + "attn_v.bias"))});
      }
    }
    L.wo = Linear::from_gguf({&file.tensor(b + "attn_output.weight")}, false, dev);
    L.wo_bias = gguf_opt(file, b + "attn_output.bias");
    L.attn_norm = gguf_norm(file, b + "attn_output_norm");
    if (nomic) {
      L.up = Linear::from_gguf({&file.tensor(b + "ffn_gate.weight"), &file.tensor(b + "ffn_up.weight")},
                               /*interleave_pairs=*/true, dev);
    } else {
      L.up = Linear::from_gguf({&file.tensor(b + "ffn_up.weight")}, false, dev);
      L.up_bias = gguf_opt(file, b + "ffn_up.bias");
    }
    L.down = Linear::from_gguf({&file.tensor(b + "ffn_down.weight")}, false, dev);
    L.down_bias = gguf_opt(file, b + "ffn_down.bias");
    L.out_norm = gguf_norm(file, b + "layer_output_norm");
  }
  if (const TensorView* out = file.find("cls.output.weight")) {
    ClassifierHead head;
    if (file.find("cls.weight")) {
      head.dense_w = host_floats(dequantize_tensor(file.tensor("cls.weight")));
      head.dense_b = host_floats(dequantize_tensor(file.tensor("cls.bias")));
    }
    head.out_w = host_floats(dequantize_tensor(*out));
    head.out_b = host_floats(dequantize_tensor(file.tensor("cls.output.bias")));
    head.labels = static_cast<int>(out->shape.size() > 1 ? out->shape[1] : 1);
    w.head = std::move(head);
    if (c.type_vocab > 1) {
      const auto sep = m.get_int("tokenizer.ggml.seperator_token_id");  // llama.cpp's spelling
      if (!sep) throw std::runtime_error(arch + " reranker without tokenizer.ggml.seperator_token_id");
      w.sep_token = static_cast<int>(*sep);
      mx::array types = dequantize_tensor(file.tensor("token_types.weight"));
      w.type1 = mx::reshape(mx::slice(types, {1, 0}, {2, d.hidden_size}), {d.hidden_size});
    }
  }
  const std::string format = "gguf:" + type_name(file.tensor("blk.0.ffn_down.weight").type);
  ModelInfo info = make_info(c.dims, arch, format, options);
  info.weight_bytes = file.file_size();
  return std::make_unique<EncoderModel>(c, info, std::move(w), dev);
}

// ---- Hugging Face safetensors ----

// The prefix a checkpoint's encoder tensors carry: "" (a bare BertModel, as
// sentence-transformers saves it) or the task model's base ("bert.", "roberta.", "model.").
std::string hf_root(const Checkpoint& w, const std::string& probe) {
  for (const std::string root : {"", "bert.", "roberta.", "model."}) {
    if (w.has(root + probe)) return root;
  }
  throw std::runtime_error("checkpoint has no tensor '" + probe + "' (nor under bert., roberta. or model.)");
}

LayerNorm hf_norm(const Checkpoint& w, const std::string& name) {
  return {w.get(name + ".weight"), w.get(name + ".bias")};
}

std::unique_ptr<Model> load_bert_family_safetensors(const std::string& dir, const Metadata& hf,
                                                    const LoadOptions& options, const std::string& arch,
                                                    bool xlm_roberta) {
  const Checkpoint w(dir, &hf);
  EncoderConfig c;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(hf.require_int("num_hidden_layers"));
  d.hidden_size = static_cast<int>(hf.require_int("hidden_size"));
  d.ffn_size = static_cast<int>(hf.require_int("intermediate_size"));
  d.n_heads = static_cast<int>(hf.require_int("num_attention_heads"));
  d.n_kv_heads = d.n_heads;
  d.head_dim = d.n_heads > 0 ? d.hidden_size / d.n_heads : 0;
  d.rms_eps = static_cast<float>(hf.get_float("layer_norm_eps").value_or(1e-12));
  d.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  const int n_positions = static_cast<int>(hf.get_int("max_position_embeddings").value_or(512));
  if (xlm_roberta) c.position_offset = static_cast<int>(hf.get_int("pad_token_id").value_or(1)) + 1;
  d.context_length = n_positions - c.position_offset;
  check_config(c, arch);
  const std::string position_type = hf.get_string("position_embedding_type").value_or("absolute");
  if (position_type != "absolute") {
    throw std::runtime_error(arch + " position_embedding_type '" + position_type + "' is not supported");
  }
  const std::string act = hf.get_string("hidden_act").value_or("gelu");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.gelu_tanh = true;
  } else if (act != "gelu") {
    throw std::runtime_error(arch + " hidden_act '" + act + "' is not supported (gelu, gelu_new)");
  }
  if (hf.get_bool("is_decoder").value_or(false)) throw std::runtime_error(arch + " decoders are not supported");

  const bool dev = options.on_device();
  const std::string r = hf_root(w, "embeddings.word_embeddings.weight");
  EncoderWeights e;
  e.tokens = w.embedding(r + "embeddings.word_embeddings");
  e.positions = w.get(r + "embeddings.position_embeddings.weight");
  if (auto types = w.find(r + "embeddings.token_type_embeddings.weight")) {
    c.type_vocab = types->shape(0);
    e.type0 = mx::reshape(mx::slice(mx::astype(*types, mx::float32), {0, 0}, {1, d.hidden_size}), {d.hidden_size});
  }
  e.embed_norm = hf_norm(w, r + "embeddings.LayerNorm");
  e.layers.resize(d.n_layers);
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string b = r + "encoder.layer." + std::to_string(i) + ".";
    const std::string a = b + "attention.self.";
    EncoderLayer& L = e.layers[i];
    L.qkv = w.linear({a + "query", a + "key", a + "value"}, dev);
    L.qkv_bias = mx::concatenate({w.get(a + "query.bias"), w.get(a + "key.bias"), w.get(a + "value.bias")});
    L.wo = w.linear({b + "attention.output.dense"}, dev);
    L.wo_bias = w.get(b + "attention.output.dense.bias");
    L.attn_norm = hf_norm(w, b + "attention.output.LayerNorm");
    L.up = w.linear({b + "intermediate.dense"}, dev);
    L.up_bias = w.get(b + "intermediate.dense.bias");
    L.down = w.linear({b + "output.dense"}, dev);
    L.down_bias = w.get(b + "output.dense.bias");
    L.out_norm = hf_norm(w, b + "output.LayerNorm");
  }
  // A sequence-classification model (a cross-encoder reranker): RoBERTa's head (dense, tanh,
  // out_proj) or BERT's (pooler dense, tanh, classifier).
  const bool roberta_head = w.has("classifier.out_proj.weight");
  if (roberta_head || w.has("classifier.weight")) {
    ClassifierHead head;
    const std::string dense = roberta_head ? "classifier.dense" : r + "pooler.dense";
    const std::string out = roberta_head ? "classifier.out_proj" : "classifier";
    head.dense_w = host_floats(w.get(dense + ".weight"));
    head.dense_b = host_floats(w.get(dense + ".bias"));
    head.out_w = host_floats(w.get(out + ".weight"));
    head.out_b = host_floats(w.get(out + ".bias"));
    head.labels = static_cast<int>(head.out_b.size());
    e.head = std::move(head);
    if (c.type_vocab > 1) {
      const auto sep = hf.get_int("sep_token_id");
      if (!sep) {
        throw std::runtime_error(arch + " cross-encoders with token types need sep_token_id in config.json");
      }
      e.sep_token = static_cast<int>(*sep);
      mx::array types = w.get(r + "embeddings.token_type_embeddings.weight");
      e.type1 = mx::reshape(mx::slice(types, {1, 0}, {2, d.hidden_size}), {d.hidden_size});
    }
  }
  ModelInfo info = make_info(c.dims, arch, w.format(), options);
  info.weight_bytes = w.stored_bytes();
  return std::make_unique<EncoderModel>(c, info, std::move(e), dev);
}

// nomic-ai's NomicBertModel (model_type nomic_bert; its config uses GPT-2's key names).
std::unique_ptr<Model> load_nomic_bert(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  const std::string arch = "nomic_bert";
  const Checkpoint w(dir, &hf);
  EncoderConfig c;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(hf.require_int("n_layer"));
  d.hidden_size = static_cast<int>(hf.require_int("n_embd"));
  d.n_heads = static_cast<int>(hf.require_int("n_head"));
  d.n_kv_heads = d.n_heads;
  d.head_dim = d.n_heads > 0 ? d.hidden_size / d.n_heads : 0;
  d.ffn_size = static_cast<int>(hf.get_int("n_inner").value_or(4 * d.hidden_size));
  d.rms_eps = static_cast<float>(hf.get_float("layer_norm_epsilon").value_or(1e-12));
  d.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  d.context_length = static_cast<int>(hf.get_int("n_positions").value_or(2048));
  check_config(c, arch);
  c.rotary = true;
  c.swiglu = true;
  c.rope_base = static_cast<float>(hf.get_float("rotary_emb_base").value_or(10000.0));
  const std::string act = hf.get_string("activation_function").value_or("swiglu");
  if (act != "swiglu") throw std::runtime_error("nomic_bert activation_function '" + act + "' is not supported");
  if (hf.get_float("rotary_emb_fraction").value_or(1.0) != 1.0 ||
      hf.get_bool("rotary_emb_interleaved").value_or(false) || hf.get_bool("prenorm").value_or(false) ||
      hf.get_int("rotary_scaling_factor").value_or(0) > 1) {
    throw std::runtime_error("nomic_bert with partial, interleaved or scaled rotary, or prenorm, is not supported");
  }
  const bool dev = options.on_device();
  const std::string r = hf_root(w, "embeddings.word_embeddings.weight");
  EncoderWeights e;
  e.tokens = w.embedding(r + "embeddings.word_embeddings");
  if (auto types = w.find(r + "embeddings.token_type_embeddings.weight")) {
    c.type_vocab = types->shape(0);
    e.type0 = mx::reshape(mx::slice(mx::astype(*types, mx::float32), {0, 0}, {1, d.hidden_size}), {d.hidden_size});
  }
  e.embed_norm = hf_norm(w, r + "emb_ln");
  e.layers.resize(d.n_layers);
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string b = r + "encoder.layers." + std::to_string(i) + ".";
    EncoderLayer& L = e.layers[i];
    L.qkv = w.linear({b + "attn.Wqkv"}, dev);
    L.qkv_bias = w.find(b + "attn.Wqkv.bias");
    L.wo = w.linear({b + "attn.out_proj"}, dev);
    L.wo_bias = w.find(b + "attn.out_proj.bias");
    L.attn_norm = hf_norm(w, b + "norm1");
    // fc12 is the gate (silu), fc11 the value it scales.
    L.up = w.linear({b + "mlp.fc12", b + "mlp.fc11"}, dev, /*interleave_pairs=*/true);
    L.down = w.linear({b + "mlp.fc2"}, dev);
    L.down_bias = w.find(b + "mlp.fc2.bias");
    L.out_norm = hf_norm(w, b + "norm2");
    if (w.has(b + "mlp.fc11.bias") || w.has(b + "mlp.fc12.bias")) {
      throw std::runtime_error("nomic_bert with mlp_fc1_bias is not supported");
    }
  }
  ModelInfo info = make_info(c.dims, arch, w.format(), options);
  info.weight_bytes = w.stored_bytes();
  return std::make_unique<EncoderModel>(c, info, std::move(e), dev);
}

}  // namespace

std::unique_ptr<Model> load_bert_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_encoder_gguf(file, options, "bert", false);
}

std::unique_ptr<Model> load_nomic_bert_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_encoder_gguf(file, options, "nomic-bert", true);
}

std::unique_ptr<Model> load_bert_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  return load_bert_family_safetensors(dir, hf, options, "bert", false);
}

std::unique_ptr<Model> load_xlm_roberta_safetensors(const std::string& dir, const Metadata& hf,
                                                    const LoadOptions& options) {
  return load_bert_family_safetensors(dir, hf, options, "xlm-roberta", true);
}

std::unique_ptr<Model> load_nomic_bert_safetensors(const std::string& dir, const Metadata& hf,
                                                   const LoadOptions& options) {
  return load_nomic_bert(dir, hf, options);
}

}  // namespace llmd
