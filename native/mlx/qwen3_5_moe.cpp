// Qwen3.5-MoE text decoder (Hugging Face `qwen3_5_moe_text` / Qwen3_5MoeForCausalLM, and the
// language model of the multimodal `qwen3_5_moe` / Qwen3_5MoeForConditionalGeneration, whose
// nested text_config is what we serve; llama.cpp's `qwen35moe` GGUF, load_qwen35_gguf), and the
// dense Qwen3.5 (`qwen3_5_text` / `qwen3_5`, GGUF `qwen35`): the same layers with a SwiGLU MLP
// where the MoE block is. Hybrid layers (config layer_types, by default three of every four
// linear):
//  - "linear_attention": a gated delta-rule linear attention (Gated DeltaNet). One projection
//    gives q|k|v (through a short causal depthwise convolution and SiLU), the output gate z,
//    and per value head beta (sigmoid) and the decay g = -exp(A_log) * softplus(a + dt_bias).
//    q and k are L2-normalised per head (q also scaled by k_dim^-0.5), k heads are shared by
//    groups of value heads, and per value head the state S [k_dim, v_dim] evolves as
//      S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
//    then o is RMS-normalised per head (plain weight), multiplied by silu(z), projected out.
//  - "full_attention": attention whose q_proj also yields a per-head output gate (sigmoid),
//    QK-norm, RoPE on the first partial_rotary_factor of each head (rotate-half), GQA.
//  - every layer: a sparse MoE block: softmax router, top-k experts (weights renormalised to
//    sum 1), SwiGLU experts, plus a shared SwiGLU expert scaled by sigmoid(shared_expert_gate)
//    (the dense model: one SwiGLU MLP).
// Norms are RMSNorm times (1 + w) (the 1 folded in at load), except the gated norm above.
//
// Multimodal RoPE (mrope_section): each rotated frequency takes its angle from the temporal,
// height or width position of the row, interleaved t, h, w, t, h, w, ... over the first
// 3 * section[1] (h) and 3 * section[2] (w) frequencies, t elsewhere (transformers'
// Qwen3_5TextRotaryEmbedding). Text rows have t = h = w, the same angles as plain RoPE, so
// a step without image rows runs the plain rotary; a step of a sequence with images gets each
// row's (t, h, w) from the engine (StepSegment::mrope: image rows on their merged patch grid,
// the text after an image shifted) and rotates with per-row tables: the CPU backend's
// attention reads them as its tables, the device path rotates q and k here and has
// mx::fast::rope rotate by position 0 (the identity). Image rows come in as embeddings
// (StepSegment::embeddings, qwen_vision.cpp's tower), attending causally as text does.
//
// Per-sequence state (the engine's SequenceKv::state): for every linear layer the recurrent
// matrix [v_heads, k_dim, v_dim] and the last conv_kernel - 1 inputs of the convolution
// [kernel - 1, conv_dim], in float32. Only full-attention layers keep KV: the KvPool's shape
// counts those layers alone (kv layer j is the j-th full-attention layer). The engine reuses a
// cached prefix only where a snapshot of this state at exactly that position exists
// (prefix_cache.h, engine.cpp).
//
// The delta rule runs token by token within a step (batched across the step's sequences at
// each token index: a decode step is one batched update); a chunked (WY / UT-transform) form
// for long prefills is left for later. The experts run as MLX gather_mm over the step's
// (row, expert) pairs sorted by expert, so each expert's rows of all sequences are one group.
//
// The experts, the convolution and the delta rule are MLX ops on both backends ("cpu" runs the
// projections as MLX float matmuls for safetensors weights, llmd's GGUF kernels for a GGUF's).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <variant>

#include "../core/op_profile.h"
#include "architectures.h"
#include "decoder.h"

namespace llmd {

namespace {

struct Qwen35Config {
  DecoderDims dims;          // n_layers: all layers; ffn_size: moe_intermediate_size (dense: intermediate_size)
  bool dense = false;        // Qwen3.5 (dense): a SwiGLU MLP per layer instead of the experts
  std::vector<bool> linear;  // per layer: linear attention (else full attention)
  int conv_kernel = 4;
  int k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0;
  int n_experts = 0, top_k = 0, shared_ffn = 0;
  bool norm_topk = true;
  int rope_dims = 0;
  std::vector<int> rope_axis;  // per rotated frequency: 0 (t), 1 (h) or 2 (w), the M-RoPE split
  // Value head j*k_heads + g reads key head g (llama.cpp's converter reorders the value heads
  // this way, "tiled", so ggml broadcasts instead of repeating); else Hugging Face's grouped
  // order, value head g*(v_heads/k_heads) + j reading key head g. Every per-value-head tensor
  // of a file is in the same order, so only the key-to-value-head map differs.
  bool tiled_v = false;
  int conv_dim() const { return 2 * k_heads * k_dim + v_heads * v_dim; }
  int n_full() const { return static_cast<int>(std::count(linear.begin(), linear.end(), false)); }
};

struct DeltaNetWeights {
  Linear in_proj;          // rows: q | k | v (conv input), z, b, a
  mx::array conv{0.f};     // [kernel, conv_dim]: tap j multiplies the input j - kernel + 1 back
  mx::array neg_a{0.f};    // -exp(A_log) [v_heads]
  mx::array dt_bias{0.f};  // [v_heads]
  mx::array norm{0.f};     // [v_dim], plain weight
  Linear out;
};

struct AttentionWeights {
  Linear qkvg;  // rows: q (all heads) | k | v | output gate (all heads)
  mx::array q_norm{0.f};
  mx::array k_norm{0.f};
  Linear wo;
};

struct MoeWeights {
  Linear router;  // rows: the experts' router, then the shared expert's gate
  mx::array gate_up{0.f};  // [experts, hidden, 2 * ffn]: gate columns then up columns
  mx::array down{0.f};     // [experts, ffn, hidden]
  Linear shared_gate_up;   // gate rows then up rows
  Linear shared_down;
  // MLX-quantized experts (mlx-lm's switch_mlp), run by gather_qmm: gate_up [experts,
  // 2 * ffn, packed hidden] (gate rows then up rows), down [experts, hidden, packed ffn].
  int bits = 0, group = 0;
  mx::array gate_up_scales{0.f}, gate_up_biases{0.f}, down_scales{0.f}, down_biases{0.f};
};

struct Layer {
  bool linear = false;
  int slot = 0;  // index among the linear layers (state) or the full ones (KV)
  mx::array in_norm{0.f};
  mx::array post_norm{0.f};
  DeltaNetWeights dn;
  AttentionWeights attn;
  MoeWeights moe;
  Linear mlp_gate_up;  // dense Qwen3.5: gate and up rows (interleaved where the kernels fuse SwiGLU)
  Linear mlp_down;
};

// Qwen3.5's multi-token-prediction head (`mtp.*`; as vLLM's Qwen3.5 MTP runs it): entry i reads
// the model's final hidden state h_i (after the final norm) and the embedding e of token i + 1,
//   x = fc([rms(e) * pre_embedding, rms(h_i) * pre_hidden])   (embedding first)
//   x = layer(x)  (a full-attention decoder layer with a MoE block, RoPE at position i)
//   y = rms(x) * norm;  logits = lm_head(y)  -> a guess of token i + 2
// Chained drafts feed y as the next entry's hidden state.
struct MtpWeights {
  mx::array pre_embedding{0.f}, pre_hidden{0.f}, norm{0.f};  // (1 + w) folded in
  Linear fc;                                                 // [hidden, 2 * hidden]
  Layer layer;                                               // full attention, KV layer 0 of the head's pool
};

// The recurrent state of one sequence (see the file comment). MLX arrays are immutable and
// every step makes new ones, so a copy may share them.
class DeltaState : public SequenceState {
 public:
  std::vector<mx::array> conv;
  std::vector<mx::array> rec;
  std::unique_ptr<SequenceState> clone() const override { return std::make_unique<DeltaState>(*this); }
  size_t bytes() const override {
    size_t n = 0;
    for (const auto& a : conv) n += a.nbytes();
    for (const auto& a : rec) n += a.nbytes();
    return n;
  }
};

mx::array silu(const mx::array& x) { return mx::multiply(x, mx::sigmoid(x)); }

mx::array int_array(const std::vector<int32_t>& v) {
  return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int32);
}

// Host-side plan of one step for the linear layers, shared by all of them.
struct LinearPlan {
  int segments = 0;
  int kernel = 0;
  mx::array conv_taps{0};    // [T * kernel] rows of [states; inputs] each tap reads
  mx::array conv_state{0};   // [segments * (kernel - 1)]: each segment's new conv state rows
  // The delta rule's token loop: iteration i updates the first m_i segments of `order`
  // (segments sorted by length, longest first) with rows rows_i.
  std::vector<int> order;
  std::vector<mx::array> rows;
  std::vector<int> active;
  mx::array unpermute{0};  // output rows in step order, from the iterations' concatenation
  struct Snapshot {
    int segment, pos, iteration, slot;  // slot: position of the segment in `order`
    mx::array conv_rows{0};             // [kernel - 1] rows of [states; inputs]
  };
  std::vector<Snapshot> snapshots;
};

class Qwen35MoeModel : public DeviceStateModel {
 public:
  Qwen35MoeModel(Qwen35Config cfg, ModelInfo info, std::vector<Layer> layers, mx::array out_norm, Linear lm_head,
                 Embedding embed, std::shared_ptr<const Rope> rope, mx::Dtype expert_dtype,
                 std::optional<MtpWeights> mtp)
      : cfg_(std::move(cfg)), info_(std::move(info)), layers_(std::move(layers)), out_norm_(std::move(out_norm)),
        lm_head_(std::move(lm_head)), embed_(std::move(embed)), rope_(std::move(rope)), expert_dtype_(expert_dtype),
        device_(lm_head_.on_device()), mtp_weights_(std::move(mtp)), mtp_head_(*this),
        mtp_device_(lm_head_.on_device()) {
    n_linear_ = static_cast<int>(std::count(cfg_.linear.begin(), cfg_.linear.end(), true));
  }

  MtpHead* mtp() override { return mtp_weights_ ? &mtp_head_ : nullptr; }

  const ModelInfo& info() const override { return info_; }
  ModelInfo& mutable_info() override { return info_; }
  bool has_recurrent_state() const override { return true; }
  // The disk tier's snapshot bytes: per linear layer (slot order) its conv state [kernel - 1,
  // conv_dim] then its recurrent matrix [v_heads, k_dim, v_dim], float32.
  size_t state_bytes() const override {
    const size_t conv = static_cast<size_t>(cfg_.conv_kernel - 1) * cfg_.conv_dim();
    const size_t rec = static_cast<size_t>(cfg_.v_heads) * cfg_.k_dim * cfg_.v_dim;
    return static_cast<size_t>(n_linear_) * (conv + rec) * sizeof(float);
  }
  void save_state(const SequenceState& state, std::byte* out) const override {
    const auto& st = dynamic_cast<const DeltaState&>(state);
    std::vector<mx::array> parts;
    for (int slot = 0; slot < n_linear_; ++slot) {
      parts.push_back(mx::contiguous(mx::astype(st.conv.at(slot), mx::float32)));
      parts.push_back(mx::contiguous(mx::astype(st.rec.at(slot), mx::float32)));
    }
    mx::eval(parts);
    size_t at = 0;
    for (const mx::array& a : parts) {
      std::memcpy(out + at, a.data<float>(), a.nbytes());
      at += a.nbytes();
    }
    if (at != state_bytes()) throw std::logic_error("qwen3_5_moe: a state snapshot of an unexpected size");
  }
  std::unique_ptr<SequenceState> load_state(const std::byte* in) const override {
    auto st = std::make_unique<DeltaState>();
    const int K = cfg_.conv_kernel, C = cfg_.conv_dim();
    const auto* at = reinterpret_cast<const float*>(in);
    for (int slot = 0; slot < n_linear_; ++slot) {
      st->conv.emplace_back(at, mx::Shape{K - 1, C}, mx::float32);
      at += static_cast<size_t>(K - 1) * C;
      st->rec.emplace_back(at, mx::Shape{cfg_.v_heads, cfg_.k_dim, cfg_.v_dim}, mx::float32);
      at += static_cast<size_t>(cfg_.v_heads) * cfg_.k_dim * cfg_.v_dim;
    }
    return st;
  }
  bool accepts_embeddings() const override { return true; }
  bool uses_mrope() const override { return true; }

  KvShape kv_shape() const override {
    DecoderDims kv = cfg_.dims;
    kv.n_layers = std::max(1, cfg_.n_full());  // full-attention layers only
    return decoder_kv_shape(kv, device_.on_device());
  }

  std::map<std::string, uint64_t> attention_paths() const override { return device_.attention_paths(); }
  bool samples_on_device() const override { return device_.on_device(); }

  std::map<std::string, std::string> matmul_paths() const override {
    std::map<std::string, std::string> paths;
    std::string experts = std::string("mlx:gather_mm:") + (expert_dtype_ == mx::float32 ? "f32" : "f16") +
                          (device_.on_device() ? "" : ":cpu");
    if (!layers_.empty() && layers_[0].moe.bits && !cfg_.dense) {
      const MoeWeights& m = layers_[0].moe;
      experts = "mlx:gather_qmm:affine" + std::to_string(m.bits) + "g" + std::to_string(m.group) + ":" +
                (mx::default_device() == mx::Device::gpu ? "gpu" : "cpu");
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      const std::string p = "blk." + std::to_string(i) + ".";
      if (L.linear) {
        paths[p + "ssm_in"] = L.dn.in_proj.path();
        paths[p + "ssm_out"] = L.dn.out.path();
      } else {
        paths[p + "attn_qkv"] = L.attn.qkvg.path();
        paths[p + "attn_output"] = L.attn.wo.path();
      }
      if (cfg_.dense) {
        paths[p + "ffn_gate_up"] = L.mlp_gate_up.path();
        paths[p + "ffn_down"] = L.mlp_down.path();
        continue;
      }
      paths[p + "ffn_gate_inp"] = L.moe.router.path();
      paths[p + "ffn_gate_up_exps"] = experts;
      paths[p + "ffn_down_exps"] = experts;
      paths[p + "ffn_gate_up_shexp"] = L.moe.shared_gate_up.path();
      paths[p + "ffn_down_shexp"] = L.moe.shared_down.path();
    }
    paths["output"] = lm_head_.path();
    return paths;
  }

  DeviceState& device_state() override { return device_; }

  void forward(const Step& step, KvPool& pool, std::vector<float>& logits) override {
    std::vector<float> hidden;
    forward(step, pool, logits, hidden);
  }

  // HiddenOut::All only (what the MTP head reads; embedding requests are refused upstream).
  void forward(const Step& step, KvPool& pool, std::vector<float>& logits, std::vector<float>& hidden) override {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const DecoderDims& d = cfg_.dims;
    StepRows rows = embed_step(step, pool, embed_, d.hidden_size);
    rows.batch->counts = device_.path_counts();
    rows.batch->build_rope_tables(*rope_);
    std::optional<DeviceAttentionPlan> plan;
    DeviceKvStore* device_kv = nullptr;
    if (device_.on_device()) {
      device_kv = &device_.prepare(pool, kv_shape());
      plan = DeviceAttentionPlan::build(*rows.batch, *rope_, device_kv);
    }
    std::optional<std::pair<mx::array, mx::array>> mrope;  // device path: per-row cos, sin
    const auto has_mrope = [](const StepSegment& s) { return !s.mrope.empty(); };
    if (std::any_of(step.segments.begin(), step.segments.end(), has_mrope)) {
      mrope_tables(step, *rows.batch);
      if (plan) {
        const int half = cfg_.rope_dims / 2;
        mrope.emplace(mx::array(rows.batch->rope_cos.begin(), {rows.total, 1, half}, mx::float32),
                      mx::array(rows.batch->rope_sin.begin(), {rows.total, 1, half}, mx::float32));
        plan->positions = mx::zeros({rows.total}, mx::int32);  // rotated already: fast::rope by 0
      }
    }
    const int S = static_cast<int>(step.segments.size());
    std::vector<const DeltaState*> before(S, nullptr);
    for (int s = 0; s < S; ++s) {
      const StepSegment& seg = step.segments[s];
      if (seg.kv->state) {
        before[s] = dynamic_cast<const DeltaState*>(seg.kv->state.get());
        if (!before[s]) throw std::logic_error("qwen3_5_moe: a sequence carries another model's state");
      } else if (seg.start_pos != 0) {
        throw std::logic_error("qwen3_5_moe: a sequence at position " + std::to_string(seg.start_pos) +
                               " has no recurrent state");
      }
    }
    const LinearPlan lp = plan_linear(step);
    std::vector<DeltaState> after(S);
    std::vector<DeltaState> snaps(lp.snapshots.size());

    const AttentionShape ashape{d.n_heads, d.n_kv_heads, d.head_dim,
                                static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)))};
    mx::array x(rows.x.begin(), {rows.total, d.hidden_size}, mx::float32);
    for (const Layer& L : layers_) {
      if (L.linear) {
        x = mx::add(x, delta_net(L, x, lp, before, after, snaps));
      } else {
        x = mx::add(x, attention(L, x, rows, plan, device_kv, ashape, mrope));
      }
      x = mx::add(x, ffn(L, x));
    }
    std::optional<mx::array> all_hidden;
    if (!rows.hidden_spans.empty()) {
      std::vector<int32_t> hidden_rows;
      for (const auto& span : rows.hidden_spans) {
        if (span.mode != HiddenOut::All) throw std::logic_error("qwen3_5_moe outputs hidden states of every row only");
        for (int r = 0; r < span.n; ++r) hidden_rows.push_back(span.first + r);
      }
      all_hidden = mx::astype(mx::fast::rms_norm(mx::take(x, int_array(hidden_rows), 0), out_norm_, d.rms_eps), mx::float32);
    }
    // The hidden rows are taken above (every row, for the MTP head); compute_outputs gives the
    // logits, or the tokens of the rows the device samples (device_sampler.h).
    rows.hidden_spans.clear();
    std::vector<float> no_hidden;
    compute_outputs(x, rows, lm_head_, out_norm_, d.rms_eps, 0.f, logits, no_hidden, build_timer);
    hidden.clear();
    if (all_hidden) {
      all_hidden->eval();
      hidden.assign(all_hidden->data<float>(), all_hidden->data<float>() + all_hidden->size());
    }
    std::vector<mx::array> states;
    for (const auto* group : {&after, &snaps}) {
      for (const DeltaState& st : *group) {
        states.insert(states.end(), st.conv.begin(), st.conv.end());
        states.insert(states.end(), st.rec.begin(), st.rec.end());
      }
    }
    mx::eval(states);
    // Only now, with the step evaluated, do the sequences move on.
    for (int s = 0; s < S; ++s) step.segments[s].kv->state = std::make_unique<DeltaState>(std::move(after[s]));
    for (size_t i = 0; i < lp.snapshots.size(); ++i) {
      const auto& snap = lp.snapshots[i];
      step.segments[snap.segment].kv->snapshots.emplace_back(snap.pos,
                                                             std::make_shared<DeltaState>(std::move(snaps[i])));
    }
  }

  // MtpHead::forward (see MtpWeights).
  void mtp_forward(const Step& step, KvPool& pool, const std::vector<float>& hidden_in, std::vector<float>& logits,
                   std::vector<float>& hidden_out) {
    std::optional<ScopedOpTimer> build_timer(std::in_place, OpKind::GraphBuild);
    const DecoderDims& d = cfg_.dims;
    const MtpWeights& m = *mtp_weights_;
    const int H = d.hidden_size;
    StepRows rows = embed_step(step, pool, embed_, H);
    rows.batch->counts = device_.path_counts();
    if (hidden_in.size() != static_cast<size_t>(rows.total) * H) {
      throw std::logic_error("qwen3_5_moe MTP: one hidden state per fed row expected");
    }
    rows.batch->build_rope_tables(*rope_);
    std::optional<DeviceAttentionPlan> plan;
    DeviceKvStore* device_kv = nullptr;
    if (mtp_device_.on_device()) {
      device_kv = &mtp_device_.prepare(pool, mtp_kv_shape());
      plan = DeviceAttentionPlan::build(*rows.batch, *rope_, device_kv);
    }
    const AttentionShape ashape{d.n_heads, d.n_kv_heads, d.head_dim,
                                static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)))};
    mx::array e(rows.x.begin(), {rows.total, H}, mx::float32);
    mx::array h(hidden_in.begin(), {rows.total, H}, mx::float32);
    mx::array x = m.fc(mx::concatenate(
        {mx::fast::rms_norm(e, m.pre_embedding, d.rms_eps), mx::fast::rms_norm(h, m.pre_hidden, d.rms_eps)}, 1));
    x = mx::astype(x, mx::float32);
    // The head runs on 1-D positions even after an image (M-RoPE rows): it only drafts, so a
    // position mismatch there costs acceptance, never correctness (the target verifies).
    x = mx::add(x, attention(m.layer, x, rows, plan, device_kv, ashape, std::nullopt));
    x = mx::add(x, ffn(m.layer, x));
    logits.clear();
    hidden_out.clear();
    if (rows.logit_rows.empty()) {
      mx::eval({x});
      return;
    }
    mx::array y = mx::astype(mx::fast::rms_norm(mx::take(x, int_array(rows.logit_rows), 0), m.norm, d.rms_eps), mx::float32);
    mx::array out = mx::astype(lm_head_(y), mx::float32);
    build_timer.reset();
    mx::eval({out, y});
    logits.assign(out.data<float>(), out.data<float>() + out.size());
    hidden_out.assign(y.data<float>(), y.data<float>() + y.size());
  }

  KvShape mtp_kv_shape() const {
    DecoderDims kv = cfg_.dims;
    kv.n_layers = 1;
    return decoder_kv_shape(kv, device_.on_device());
  }

 private:
  // The batch's rope tables [rows][rope_dims / 2] at each row's M-RoPE position (rows of
  // segments without StepSegment::mrope at start_pos + i on every axis).
  void mrope_tables(const Step& step, AttentionBatch& batch) const {
    const int half = cfg_.rope_dims / 2;
    batch.rope_cos.resize(static_cast<size_t>(step.total_tokens()) * half);
    batch.rope_sin.resize(batch.rope_cos.size());
    size_t row = 0;
    for (const StepSegment& seg : step.segments) {
      for (int i = 0; i < static_cast<int>(seg.tokens.size()); ++i, ++row) {
        const int p = seg.start_pos + i;
        const std::array<int32_t, 3> at = seg.mrope.empty() ? std::array<int32_t, 3>{p, p, p} : seg.mrope[i];
        for (int j = 0; j < half; ++j) {
          const double angle = static_cast<double>(at[cfg_.rope_axis[j]]) * rope_->inv_freq[j];
          batch.rope_cos[row * half + j] = static_cast<float>(std::cos(angle));
          batch.rope_sin[row * half + j] = static_cast<float>(std::sin(angle));
        }
      }
    }
  }

  // Rotate-half over the first rope_dims of each head of x [T, heads * head_dim], with per-row
  // tables cos, sin [T, 1, rope_dims / 2].
  mx::array rotate(const mx::array& x, int heads, const std::pair<mx::array, mx::array>& cs) const {
    const int T = x.shape(0), hd = cfg_.dims.head_dim, R = cfg_.rope_dims, half = R / 2;
    mx::array h = mx::reshape(x, {T, heads, hd});
    mx::array a = mx::slice(h, {0, 0, 0}, {T, heads, half});
    mx::array b = mx::slice(h, {0, 0, half}, {T, heads, R});
    const auto& [c, sn] = cs;
    std::vector<mx::array> parts = {mx::subtract(mx::multiply(a, c), mx::multiply(b, sn)),
                                    mx::add(mx::multiply(b, c), mx::multiply(a, sn))};
    if (R < hd) parts.push_back(mx::slice(h, {0, 0, R}, {T, heads, hd}));
    return mx::reshape(mx::concatenate(parts, 2), {T, heads * hd});
  }

  class Head : public MtpHead {
   public:
    explicit Head(Qwen35MoeModel& model) : model_(model) {}
    KvShape kv_shape() const override { return model_.mtp_kv_shape(); }
    void forward(const Step& step, KvPool& pool, const std::vector<float>& hidden_in, std::vector<float>& logits,
                 std::vector<float>& hidden_out) override {
      model_.mtp_forward(step, pool, hidden_in, logits, hidden_out);
    }

   private:
    Qwen35MoeModel& model_;
  };

  LinearPlan plan_linear(const Step& step) const {
    LinearPlan p;
    const int S = static_cast<int>(step.segments.size());
    const int K = cfg_.conv_kernel;
    p.segments = S;
    p.kernel = K;
    std::vector<int> row0(S), len(S);
    int T = 0;
    for (int s = 0; s < S; ++s) {
      row0[s] = T;
      len[s] = static_cast<int>(step.segments[s].tokens.size());
      T += len[s];
    }
    // Rows of the conv input buffer [S * (K - 1) state rows; T step rows]: element e of
    // segment s's extended input (its K - 1 state rows, then its tokens).
    const auto ext = [&](int s, int e) { return e < K - 1 ? s * (K - 1) + e : S * (K - 1) + row0[s] + e - (K - 1); };
    std::vector<int32_t> taps, state_rows;
    taps.reserve(static_cast<size_t>(T) * K);
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < len[s]; ++i) {
        for (int j = 0; j < K; ++j) taps.push_back(ext(s, i + j));
      }
      for (int j = 0; j < K - 1; ++j) state_rows.push_back(ext(s, len[s] + j));
    }
    p.conv_taps = int_array(taps);
    p.conv_state = int_array(state_rows);

    p.order.resize(S);
    for (int s = 0; s < S; ++s) p.order[s] = s;
    std::stable_sort(p.order.begin(), p.order.end(), [&](int a, int b) { return len[a] > len[b]; });
    const int iterations = S ? len[p.order[0]] : 0;
    std::vector<int32_t> out_rows;
    for (int i = 0, m = S; i < iterations; ++i) {
      while (m > 0 && len[p.order[m - 1]] <= i) --m;
      std::vector<int32_t> r(m);
      for (int j = 0; j < m; ++j) r[j] = row0[p.order[j]] + i;
      out_rows.insert(out_rows.end(), r.begin(), r.end());
      p.rows.push_back(int_array(r));
      p.active.push_back(m);
    }
    std::vector<int32_t> unpermute(T);
    for (int k = 0; k < T; ++k) unpermute[out_rows[k]] = k;
    p.unpermute = int_array(unpermute);

    for (int j = 0; j < S; ++j) {
      const int s = p.order[j];
      const StepSegment& seg = step.segments[s];
      for (int pos : seg.snapshot_at) {
        const int i = pos - seg.start_pos - 1;  // the state after local token i
        if (i < 0 || i >= len[s]) throw std::logic_error("snapshot position outside its segment");
        std::vector<int32_t> cr;
        for (int e = 0; e < K - 1; ++e) cr.push_back(ext(s, i + 1 + e));
        p.snapshots.push_back({s, pos, i, j, int_array(cr)});
      }
    }
    return p;
  }

  // One linear-attention token mixer over the whole step; returns its output [T, hidden].
  mx::array delta_net(const Layer& L, const mx::array& x, const LinearPlan& lp,
                      const std::vector<const DeltaState*>& before, std::vector<DeltaState>& after,
                      std::vector<DeltaState>& snaps) const {
    const DecoderDims& d = cfg_.dims;
    const int T = x.shape(0), S = lp.segments, K = lp.kernel, C = cfg_.conv_dim();
    const int nk = cfg_.k_heads, nv = cfg_.v_heads, dk = cfg_.k_dim, dv = cfg_.v_dim;
    const int kw = nk * dk, vw = nv * dv;
    mx::array proj = L.dn.in_proj(x, {.rms_norm_weight = L.in_norm, .eps = d.rms_eps});
    mx::array mixed = mx::slice(proj, {0, 0}, {T, C});
    mx::array z = mx::reshape(mx::slice(proj, {0, C}, {T, C + vw}), {T, nv, dv});
    mx::array b = mx::slice(proj, {0, C + vw}, {T, C + vw + nv});
    mx::array a = mx::slice(proj, {0, C + vw + nv}, {T, C + vw + 2 * nv});

    // Causal depthwise convolution over [previous K - 1 inputs; this step's], per sequence.
    std::vector<mx::array> parts;
    for (int s = 0; s < S; ++s) {
      parts.push_back(before[s] ? before[s]->conv[L.slot] : mx::zeros({K - 1, C}, mx::float32));
    }
    parts.push_back(mixed);
    mx::array buffer = mx::concatenate(parts, 0);
    mx::array taps = mx::reshape(mx::take(buffer, lp.conv_taps, 0), {T, K, C});
    mx::array conv = silu(mx::sum(mx::multiply(taps, L.dn.conv), 1));
    for (int s = 0; s < S; ++s) {
      after[s].conv.push_back(mx::take(buffer, mx::slice(lp.conv_state, {s * (K - 1)}, {(s + 1) * (K - 1)}), 0));
    }
    for (size_t i = 0; i < lp.snapshots.size(); ++i) {
      snaps[i].conv.push_back(mx::take(buffer, lp.snapshots[i].conv_rows, 0));
    }

    // q, k L2-normalised per head (q also by k_dim^-0.5), each k head shared by nv / nk
    // value heads: consecutive ones, or every nk-th in the tiled order (Qwen35Config::tiled_v).
    const auto l2 = [](const mx::array& t) {
      return mx::multiply(t, mx::rsqrt(mx::add(mx::sum(mx::square(t), -1, true), mx::array(1e-6f))));
    };
    const auto spread = [&](const mx::array& t) {
      if (nk == nv) return t;
      if (cfg_.tiled_v) return mx::reshape(mx::broadcast_to(mx::expand_dims(t, 1), {T, nv / nk, nk, dk}), {T, nv, dk});
      return mx::reshape(mx::broadcast_to(mx::expand_dims(t, 2), {T, nk, nv / nk, dk}), {T, nv, dk});
    };
    mx::array q = spread(mx::multiply(l2(mx::reshape(mx::slice(conv, {0, 0}, {T, kw}), {T, nk, dk})),
                                      mx::array(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk))))));
    mx::array k = spread(l2(mx::reshape(mx::slice(conv, {0, kw}, {T, 2 * kw}), {T, nk, dk})));
    mx::array v = mx::reshape(mx::slice(conv, {0, 2 * kw}, {T, C}), {T, nv, dv});
    mx::array beta = mx::sigmoid(b);
    // softplus(a + dt_bias) as log(1 + e^t), stable for large t.
    mx::array decay = mx::exp(mx::multiply(L.dn.neg_a, mx::logaddexp(mx::add(a, L.dn.dt_bias), mx::array(0.f))));

    // The recurrence, one token index at a time over all sequences still running.
    std::vector<mx::array> st;
    for (int s : lp.order) st.push_back(before[s] ? before[s]->rec[L.slot] : mx::zeros({nv, dk, dv}, mx::float32));
    mx::array state = mx::stack(st, 0);  // [m, nv, dk, dv] in `order`
    std::vector<std::optional<mx::array>> final(S);
    std::vector<mx::array> outs;
    size_t next_snap = 0;
    std::vector<size_t> snap_by_iter(lp.snapshots.size());
    for (size_t i = 0; i < lp.snapshots.size(); ++i) snap_by_iter[i] = i;
    std::sort(snap_by_iter.begin(), snap_by_iter.end(),
              [&](size_t x1, size_t x2) { return lp.snapshots[x1].iteration < lp.snapshots[x2].iteration; });
    int m = S;
    for (size_t it = 0; it < lp.rows.size(); ++it) {
      const int now = lp.active[it];
      if (now < m) {
        for (int j = now; j < m; ++j) final[lp.order[j]] = mx::squeeze(mx::slice(state, {j, 0, 0, 0}, {j + 1, nv, dk, dv}), 0);
        state = mx::slice(state, {0, 0, 0, 0}, {now, nv, dk, dv});
        m = now;
      }
      const mx::array& r = lp.rows[it];
      mx::array qi = mx::expand_dims(mx::take(q, r, 0), 2);  // [m, nv, 1, dk]
      mx::array ki = mx::expand_dims(mx::take(k, r, 0), 2);
      mx::array vi = mx::expand_dims(mx::take(v, r, 0), 2);  // [m, nv, 1, dv]
      mx::array gi = mx::reshape(mx::take(decay, r, 0), {m, nv, 1, 1});
      mx::array bi = mx::reshape(mx::take(beta, r, 0), {m, nv, 1, 1});
      state = mx::multiply(state, gi);
      mx::array delta = mx::multiply(mx::subtract(vi, mx::matmul(ki, state)), bi);  // [m, nv, 1, dv]
      state = mx::add(state, mx::matmul(mx::swapaxes(ki, 2, 3), delta));
      outs.push_back(mx::reshape(mx::matmul(qi, state), {m, nv, dv}));
      for (; next_snap < snap_by_iter.size() && lp.snapshots[snap_by_iter[next_snap]].iteration == static_cast<int>(it);
           ++next_snap) {
        const auto& sn = lp.snapshots[snap_by_iter[next_snap]];
        snaps[snap_by_iter[next_snap]].rec.push_back(
            mx::squeeze(mx::slice(state, {sn.slot, 0, 0, 0}, {sn.slot + 1, nv, dk, dv}), 0));
      }
    }
    for (int j = 0; j < m; ++j) final[lp.order[j]] = mx::squeeze(mx::slice(state, {j, 0, 0, 0}, {j + 1, nv, dk, dv}), 0);
    for (int s = 0; s < S; ++s) after[s].rec.push_back(*final[s]);
    mx::array o = mx::take(mx::concatenate(outs, 0), lp.unpermute, 0);  // [T, nv, dv]

    // Gated RMSNorm per value head, then the output projection.
    o = mx::multiply(mx::fast::rms_norm(o, L.dn.norm, d.rms_eps), silu(z));
    return L.dn.out(mx::reshape(o, {T, vw}));
  }

  mx::array attention(const Layer& L, const mx::array& x, const StepRows& rows,
                      const std::optional<DeviceAttentionPlan>& plan, DeviceKvStore* device_kv,
                      const AttentionShape& shape,
                      const std::optional<std::pair<mx::array, mx::array>>& mrope) const {
    const DecoderDims& d = cfg_.dims;
    const int T = x.shape(0), hd = d.head_dim, qw = d.n_heads * hd, kw = d.n_kv_heads * hd;
    mx::array qkvg = L.attn.qkvg(x, {.rms_norm_weight = L.in_norm, .eps = d.rms_eps});
    const bool dev = device_kv != nullptr;
    mx::array q = head_rms_norm(mx::slice(qkvg, {0, 0}, {T, qw}), L.attn.q_norm, d.n_heads, hd, d.rms_eps, dev);
    mx::array k =
        head_rms_norm(mx::slice(qkvg, {0, qw}, {T, qw + kw}), L.attn.k_norm, d.n_kv_heads, hd, d.rms_eps, dev);
    mx::array v = mx::slice(qkvg, {0, qw + kw}, {T, qw + 2 * kw});
    mx::array gate = mx::slice(qkvg, {0, qw + 2 * kw}, {T, 2 * qw + 2 * kw});
    if (mrope) {
      q = rotate(q, d.n_heads, *mrope);
      k = rotate(k, d.n_kv_heads, *mrope);
    }
    mx::array qkv = mx::concatenate({q, k, v}, 1);
    mx::array a = device_kv ? device_attention(qkv, *plan, L.slot, shape, *rope_, *device_kv)
                            : paged_attention(qkv, rows.batch, L.slot, shape, rope_);
    return L.attn.wo(mx::multiply(a, mx::sigmoid(gate)));
  }

  // The layer's feed-forward of the residual stream x: its post-attention norm, then the
  // dense SwiGLU (Qwen3.5) or the experts (Qwen3.5-MoE).
  mx::array ffn(const Layer& L, const mx::array& x) const {
    if (cfg_.dense) {
      return L.mlp_down(L.mlp_gate_up(x, {.rms_norm_weight = L.post_norm, .eps = cfg_.dims.rms_eps, .swiglu = true}));
    }
    return moe(L.moe, mx::fast::rms_norm(x, L.post_norm, cfg_.dims.rms_eps));
  }

  // Routed experts plus the gated shared expert of normalised rows xn [T, hidden].
  mx::array moe(const MoeWeights& w, const mx::array& xn) const {
    const int T = xn.shape(0), H = cfg_.dims.hidden_size, E = cfg_.n_experts, K = cfg_.top_k;
    const int F = cfg_.dims.ffn_size;
    mx::array routed_and_gate = w.router(xn);
    mx::array probs = mx::softmax(mx::slice(routed_and_gate, {0, 0}, {T, E}), -1, true);
    mx::array shared_gate = mx::sigmoid(mx::slice(routed_and_gate, {0, E}, {T, E + 1}));
    mx::array experts = mx::slice(mx::argpartition(mx::negative(probs), K - 1, -1), {0, 0}, {T, K});
    mx::array weights = mx::take_along_axis(probs, experts, -1);  // [T, K]
    if (cfg_.norm_topk) weights = mx::divide(weights, mx::sum(weights, -1, true));
    // (row, expert) pairs sorted by expert: each expert multiplies one contiguous group.
    mx::array flat = mx::reshape(experts, {T * K});
    mx::array order = mx::argsort(flat);
    mx::array sorted_experts = mx::take(flat, order, 0);
    mx::array src_rows = mx::floor_divide(order, mx::array(K, mx::uint32));
    mx::array xs = mx::expand_dims(mx::astype(mx::take(xn, src_rows, 0), expert_dtype_), 1);  // [TK, 1, H]
    auto expert_mm = [&](const mx::array& x, const mx::array& wt, const mx::array& scales, const mx::array& biases) {
      if (!w.bits) return mx::gather_mm(x, wt, std::nullopt, sorted_experts, true);
      return mx::gather_qmm(x, wt, scales, biases, std::nullopt, sorted_experts, /*transpose=*/true, w.group, w.bits,
                            "affine", std::nullopt, /*sorted_indices=*/true);
    };
    mx::array gu = mx::astype(expert_mm(xs, w.gate_up, w.gate_up_scales, w.gate_up_biases), mx::float32);
    mx::array h = mx::multiply(silu(mx::slice(gu, {0, 0, 0}, {T * K, 1, F})), mx::slice(gu, {0, 0, F}, {T * K, 1, 2 * F}));
    mx::array y = expert_mm(mx::astype(h, expert_dtype_), w.down, w.down_scales, w.down_biases);
    y = mx::take(mx::reshape(mx::astype(y, mx::float32), {T * K, H}), mx::argsort(order), 0);
    mx::array routed = mx::sum(mx::multiply(mx::reshape(y, {T, K, H}), mx::expand_dims(weights, 2)), 1);
    mx::array shared = w.shared_down(w.shared_gate_up(xn, {.swiglu = true}));
    return mx::add(routed, mx::multiply(shared_gate, shared));
  }

  Qwen35Config cfg_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  mx::array out_norm_;
  Linear lm_head_;
  Embedding embed_;
  std::shared_ptr<const Rope> rope_;
  mx::Dtype expert_dtype_;
  int n_linear_ = 0;
  DeviceState device_;
  std::optional<MtpWeights> mtp_weights_;
  Head mtp_head_;
  DeviceState mtp_device_;  // the MTP head's KV on the device (a pool of its own)
};

// M-RoPE's split (mrope_section, or GGUF rope.dimension_sections): see the file comment.
void set_rope_axes(Qwen35Config& c, const std::array<int, 3>& section) {
  c.rope_axis.assign(c.rope_dims / 2, 0);
  for (int j = 0; j < c.rope_dims / 2; ++j) {
    if (j % 3 == 1 && j < 3 * section[1]) c.rope_axis[j] = 1;
    if (j % 3 == 2 && j < 3 * section[2]) c.rope_axis[j] = 2;
  }
}

// Float experts gate_up [E, 2F, H] (gate rows then up rows) and down [E, H, F], as gather_mm
// multiplies x [.., 1, H] by them: [H, 2F] and [F, H] per expert, in `dtype`.
void set_float_experts(MoeWeights& moe, const mx::array& gate_up, const mx::array& down, const Qwen35Config& c,
                       mx::Dtype dtype, const std::string& what) {
  const int E = c.n_experts, F = c.dims.ffn_size, H = c.dims.hidden_size;
  if (gate_up.shape() != mx::Shape{E, 2 * F, H} || down.shape() != mx::Shape{E, H, F}) {
    throw std::runtime_error("qwen3_5_moe expert tensors of " + what + " do not match num_experts x moe_intermediate_size");
  }
  moe.gate_up = mx::contiguous(mx::astype(mx::swapaxes(gate_up, 1, 2), dtype));
  moe.down = mx::contiguous(mx::astype(mx::swapaxes(down, 1, 2), dtype));
  mx::eval({moe.gate_up, moe.down});
}

std::string prefix_of(const Checkpoint& w) {
  // Text-only checkpoints (Qwen3_5MoeForCausalLM) name the decoder `model.`; multimodal ones
  // (Qwen3_5MoeForConditionalGeneration) nest it as `model.language_model.`.
  for (const char* prefix : {"model.language_model.", "model.", "language_model.model."}) {
    if (w.has(std::string(prefix) + "embed_tokens.weight")) return prefix;
  }
  throw std::runtime_error("qwen3_5_moe checkpoint has no embed_tokens.weight under model. or model.language_model.");
}

// A Hugging Face directory of either model: `dense` for Qwen3.5 (`qwen3_5_text` / `qwen3_5`).
std::unique_ptr<Model> load_qwen35_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options,
                                               bool dense) {
  const std::string arch = dense ? "qwen3_5" : "qwen3_5_moe";
  Qwen35Config c;
  c.dense = dense;
  DecoderDims& d = c.dims;
  d.n_layers = static_cast<int>(hf.require_int("num_hidden_layers"));
  d.hidden_size = static_cast<int>(hf.require_int("hidden_size"));
  d.n_heads = static_cast<int>(hf.require_int("num_attention_heads"));
  d.n_kv_heads = static_cast<int>(hf.get_int("num_key_value_heads").value_or(d.n_heads));
  d.head_dim = static_cast<int>(hf.get_int("head_dim").value_or(256));
  d.rms_eps = static_cast<float>(hf.get_float("rms_norm_eps").value_or(1e-6));
  d.context_length = static_cast<int>(hf.get_int("max_position_embeddings").value_or(32768));
  d.vocab_size = static_cast<int>(hf.require_int("vocab_size"));
  d.ffn_size = static_cast<int>(dense ? hf.require_int("intermediate_size")
                                       : hf.get_int("moe_intermediate_size").value_or(512));
  c.shared_ffn = static_cast<int>(hf.get_int("shared_expert_intermediate_size").value_or(512));
  c.n_experts = static_cast<int>(hf.get_int("num_experts").value_or(256));
  c.top_k = static_cast<int>(hf.get_int("num_experts_per_tok").value_or(8));
  c.norm_topk = hf.get_bool("norm_topk_prob").value_or(true);  // transformers always normalises
  c.conv_kernel = static_cast<int>(hf.get_int("linear_conv_kernel_dim").value_or(4));
  c.k_heads = static_cast<int>(hf.get_int("linear_num_key_heads").value_or(16));
  c.v_heads = static_cast<int>(hf.get_int("linear_num_value_heads").value_or(32));
  c.k_dim = static_cast<int>(hf.get_int("linear_key_head_dim").value_or(128));
  c.v_dim = static_cast<int>(hf.get_int("linear_value_head_dim").value_or(128));
  d.check("qwen3_5_moe");
  const std::string act = hf.get_string("hidden_act").value_or("silu");
  if (act != "silu") throw std::runtime_error("qwen3_5_moe hidden_act '" + act + "' is not supported (expected silu)");
  if (hf.get_bool("attention_bias").value_or(false)) {
    throw std::runtime_error("qwen3_5_moe with attention_bias is not supported (Qwen3.5 checkpoints have none)");
  }
  if ((!dense && (c.n_experts <= 0 || c.top_k <= 0 || c.top_k > c.n_experts || c.shared_ffn <= 0)) ||
      c.k_heads <= 0 || c.v_heads <= 0 || c.v_heads % c.k_heads != 0 || c.k_dim <= 0 || c.v_dim <= 0 ||
      c.conv_kernel < 2) {
    throw std::runtime_error("inconsistent " + arch + " hyperparameters (experts, top-k or linear attention)");
  }
  if (hf.has("layer_types.0")) {
    for (int i = 0; hf.has("layer_types." + std::to_string(i)); ++i) {
      const std::string t = *hf.get_string("layer_types." + std::to_string(i));
      if (t != "linear_attention" && t != "full_attention") {
        throw std::runtime_error("qwen3_5_moe layer type '" + t + "' is not supported");
      }
      c.linear.push_back(t == "linear_attention");
    }
  } else {
    const int every = static_cast<int>(hf.get_int("full_attention_interval").value_or(4));
    for (int i = 0; i < d.n_layers; ++i) c.linear.push_back((i + 1) % every != 0);
  }
  if (static_cast<int>(c.linear.size()) != d.n_layers) {
    throw std::runtime_error("qwen3_5_moe layer_types has " + std::to_string(c.linear.size()) + " entries for " +
                             std::to_string(d.n_layers) + " layers");
  }
  const auto [rope_type, rope_factor] = hf_rope_scaling(hf);
  if (!rope_type.empty()) {
    throw std::runtime_error("qwen3_5_moe rope type '" + rope_type + "' is not supported yet");
  }
  const double partial =
      hf.get_float("rope_parameters.partial_rotary_factor").value_or(hf.get_float("partial_rotary_factor").value_or(0.25));
  c.rope_dims = static_cast<int>(d.head_dim * partial);
  if (c.rope_dims <= 0 || c.rope_dims % 2 != 0 || c.rope_dims > d.head_dim) {
    throw std::runtime_error("qwen3_5_moe partial_rotary_factor " + std::to_string(partial) + " is not supported");
  }
  // M-RoPE's split of the rotated frequencies (see the file comment); Qwen3.5's default when
  // the config names none.
  std::array<int, 3> section = {11, 11, 10};
  for (const std::string prefix : {"rope_parameters.", "rope_scaling.", ""}) {
    if (!hf.has(prefix + "mrope_section.0")) continue;
    for (int a = 0; a < 3; ++a) {
      section[a] = static_cast<int>(hf.get_int(prefix + "mrope_section." + std::to_string(a)).value_or(0));
    }
    break;
  }
  set_rope_axes(c, section);
  auto rope = std::make_shared<Rope>();
  rope->dims = c.rope_dims;
  rope->interleaved = false;  // rotate-half over the rotated dims
  rope->inv_freq = rope_inv_freq(c.rope_dims, hf_rope_theta(hf, 10000.0));

  const Checkpoint w(dir, &hf);
  const std::string m = prefix_of(w);
  const bool dev = options.on_device();
  const mx::Dtype expert_dtype = dev ? device_compute_dtype() : mx::float32;
  // mlx-lm's checkpoints (sanitized: conv1d weights [conv_dim, kernel, 1]) store the decoder
  // norms as 1 + w already; Hugging Face's ([conv_dim, 1, kernel]) store w.
  bool norms_hold_one = false;
  for (int i = 0; i < d.n_layers; ++i) {
    const std::string conv = m + "layers." + std::to_string(i) + ".linear_attn.conv1d.weight";
    if (w.has(conv)) {
      norms_hold_one = w.get(conv).shape(-1) == 1 && c.conv_kernel > 1;
      break;
    }
  }
  auto norm = [&](const std::string& name) {  // (1 + w) folded in
    mx::array a = norms_hold_one ? w.get(name) : mx::add(w.get(name), mx::array(1.f));
    a.eval();
    return a;
  };
  auto plain = [&](mx::array a) {
    a.eval();
    return a;
  };
  const int H = d.hidden_size, F = d.ffn_size, E = c.n_experts;
  std::vector<Layer> layers(d.n_layers);
  int n_linear = 0, n_full = 0;
  // One decoder layer under prefix b (`what` names it in errors): the model's, or the MTP head's.
  auto load_layer = [&](const std::string& b, bool linear, int slot, const std::string& what) {
    Layer L;
    L.linear = linear;
    L.slot = slot;
    L.in_norm = norm(b + "input_layernorm.weight");
    L.post_norm = norm(b + "post_attention_layernorm.weight");
    if (L.linear) {
      const std::string a = b + "linear_attn.";
      L.dn.in_proj = w.linear({a + "in_proj_qkv", a + "in_proj_z", a + "in_proj_b", a + "in_proj_a"}, dev);
      if (L.dn.in_proj.out_features() != c.conv_dim() + c.v_heads * c.v_dim + 2 * c.v_heads) {
        throw std::runtime_error("qwen3_5_moe linear attention projections do not match the config's head counts");
      }
      mx::array conv = w.get(a + "conv1d.weight");  // [conv_dim, 1, kernel] or mlx-lm's [conv_dim, kernel, 1]
      L.dn.conv = plain(mx::contiguous(mx::transpose(mx::reshape(conv, {c.conv_dim(), c.conv_kernel}))));
      L.dn.neg_a = plain(mx::negative(mx::exp(w.get(a + "A_log"))));
      L.dn.dt_bias = plain(w.get(a + "dt_bias"));
      L.dn.norm = plain(w.get(a + "norm.weight"));
      L.dn.out = w.linear({a + "out_proj"}, dev);
    } else {
      const std::string a = b + "self_attn.";
      // q_proj's rows are per head [query (head_dim), gate (head_dim)]: regroup them as all
      // queries then all gates, and stack with k and v.
      const int qw = d.n_heads * d.head_dim;
      auto half = [&](const mx::array& rows, int which) {  // query (0) or gate (1) rows, any row width
        const int cols = rows.shape(1);
        mx::array qg = mx::reshape(rows, {d.n_heads, 2, d.head_dim, cols});
        return mx::reshape(mx::slice(qg, {0, which, 0, 0}, {d.n_heads, which + 1, d.head_dim, cols}), {qw, cols});
      };
      auto qp = w.quantized_parts(a + "q_proj"), kp = w.quantized_parts(a + "k_proj"),
           vp = w.quantized_parts(a + "v_proj");
      const auto qq = w.quantization(a + "q_proj");
      if (qp && kp && vp && w.quantization(a + "k_proj")->bits == qq->bits &&
          w.quantization(a + "v_proj")->bits == qq->bits) {
        auto part = [&](int which) {
          return Linear::MlxQuantized{half(qp->w, which), half(qp->scales, which), half(qp->biases, which)};
        };
        L.attn.qkvg = Linear::from_mlx_quantized({part(0), *kp, *vp, part(1)}, qq->bits, qq->group_size, dev);
      } else {
        mx::array qrows = w.get(a + "q_proj.weight");
        L.attn.qkvg = Linear::from_float(
            mx::concatenate({half(qrows, 0), w.get(a + "k_proj.weight"), w.get(a + "v_proj.weight"), half(qrows, 1)}, 0),
            dev);
      }
      L.attn.q_norm = norm(a + "q_norm.weight");
      L.attn.k_norm = norm(a + "k_norm.weight");
      L.attn.wo = w.linear({a + "o_proj"}, dev);
    }
    const std::string p = b + "mlp.";
    if (dense) {
      // Interleaved where llmd's kernels fuse the SwiGLU (a quantized CPU weight), as the shared expert.
      L.mlp_gate_up = w.linear({p + "gate_proj", p + "up_proj"}, dev, /*interleave_pairs=*/true);
      L.mlp_down = w.linear({p + "down_proj"}, dev);
      return L;
    }
    L.moe.router = w.linear({p + "gate", p + "shared_expert_gate"}, dev);
    mx::array gate_up{0.f}, down{0.f};
    const std::string sw = p + "switch_mlp.";
    auto gq = w.quantized_parts(sw + "gate_proj"), uq = w.quantized_parts(sw + "up_proj"),
         dq = w.quantized_parts(sw + "down_proj");
    if (gq && uq && dq && w.quantization(sw + "gate_proj")->bits == w.quantization(sw + "down_proj")->bits &&
        w.quantization(sw + "up_proj")->bits == w.quantization(sw + "down_proj")->bits) {
      // mlx-lm's quantized experts stay packed: gather_qmm over the step's (row, expert) pairs.
      const auto q = *w.quantization(sw + "down_proj");
      const auto cpu = mx::default_stream(mx::Device::cpu);
      MoeWeights& mo = L.moe;
      mo.bits = q.bits;
      mo.group = q.group_size;
      mo.gate_up = plain(mx::concatenate({gq->w, uq->w}, 1, cpu));
      mo.gate_up_scales = plain(mx::astype(mx::concatenate({gq->scales, uq->scales}, 1, cpu), expert_dtype, cpu));
      mo.gate_up_biases = plain(mx::astype(mx::concatenate({gq->biases, uq->biases}, 1, cpu), expert_dtype, cpu));
      mo.down = plain(mx::contiguous(dq->w, false, cpu));
      mo.down_scales = plain(mx::astype(dq->scales, expert_dtype, cpu));
      mo.down_biases = plain(mx::astype(dq->biases, expert_dtype, cpu));
      if (mo.gate_up.ndim() != 3 || mo.gate_up.shape(0) != E || mo.gate_up.shape(1) != 2 * F ||
          mo.gate_up.shape(2) * 32 / q.bits != H || mo.down.shape(0) != E || mo.down.shape(1) != H ||
          mo.down.shape(2) * 32 / q.bits != F) {
        throw std::runtime_error("qwen3_5_moe quantized expert tensors of " + what +
                                 " do not match num_experts x moe_intermediate_size");
      }
    } else if (w.has(sw + "gate_proj.weight")) {  // mlx-lm's layout, float (or mixed) experts
      gate_up = mx::concatenate({w.get(sw + "gate_proj.weight"), w.get(sw + "up_proj.weight")}, 1);
      down = w.get(sw + "down_proj.weight");
    } else if (w.has(p + "experts.gate_up_proj")) {  // transformers 5: [E, 2F, H] and [E, H, F]
      gate_up = w.get(p + "experts.gate_up_proj");
      down = w.get(p + "experts.down_proj");
    } else {  // one module per expert (older conversions)
      std::vector<mx::array> gu, dn;
      for (int e = 0; e < E; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        gu.push_back(mx::concatenate({w.get(x + "gate_proj.weight"), w.get(x + "up_proj.weight")}, 0));
        dn.push_back(w.get(x + "down_proj.weight"));
      }
      gate_up = mx::stack(gu, 0);
      down = mx::stack(dn, 0);
    }
    if (!L.moe.bits) set_float_experts(L.moe, gate_up, down, c, expert_dtype, what);
    const std::string s = p + "shared_expert.";
    // Interleaved only where llmd's kernels fuse the SwiGLU (a quantized CPU weight).
    L.moe.shared_gate_up = w.linear({s + "gate_proj", s + "up_proj"}, dev, /*interleave_pairs=*/true);
    L.moe.shared_down = w.linear({s + "down_proj"}, dev);
    return L;
  };
  for (int i = 0; i < d.n_layers; ++i) {
    layers[i] = load_layer(m + "layers." + std::to_string(i) + ".", c.linear[i], c.linear[i] ? n_linear++ : n_full++,
                           "layer " + std::to_string(i));
  }
  mx::array out_norm = norm(m + "norm.weight");
  std::string head = "lm_head.weight";
  if (!w.has(head) && w.has("language_model.lm_head.weight")) head = "language_model.lm_head.weight";
  const bool tied = !w.has(head) || hf.get_bool("tie_word_embeddings").value_or(false);
  Linear lm_head = w.linear({tied ? m + "embed_tokens" : head.substr(0, head.size() - 7)}, dev);
  Embedding embed = w.embedding(m + "embed_tokens", tied ? &lm_head : nullptr);
  // The multi-token-prediction head, where the checkpoint ships one (Qwen3.5's do; mlx-lm's
  // conversions drop it): its decoder layer is a full-attention one, alone in a KV pool of its own.
  std::optional<MtpWeights> mtp;
  if (w.has("mtp.fc.weight")) {
    const int n_mtp = static_cast<int>(hf.get_int("mtp_num_hidden_layers").value_or(1));
    if (n_mtp != 1) {
      throw std::runtime_error("qwen3_5_moe with " + std::to_string(n_mtp) + " MTP layers is not supported (expected 1)");
    }
    MtpWeights& t = mtp.emplace();
    t.pre_embedding = norm("mtp.pre_fc_norm_embedding.weight");
    t.pre_hidden = norm("mtp.pre_fc_norm_hidden.weight");
    t.fc = w.linear({"mtp.fc"}, dev);
    if (t.fc.out_features() != H) throw std::runtime_error("qwen3_5_moe mtp.fc does not map 2 x hidden_size to hidden_size");
    t.layer = load_layer("mtp.layers.0.", false, 0, "the MTP layer");
    t.norm = norm("mtp.norm.weight");
  }
  ModelInfo info = make_info(d, arch, w.format(), options);
  return std::make_unique<Qwen35MoeModel>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                          rope, expert_dtype, std::move(mtp));
}

// llama.cpp's `qwen35moe` GGUF (convert_hf_to_gguf.py, Qwen3_5MoeTextModel): the same model
// under llama.cpp's names, with what its converter changed undone or adopted:
//  - the value heads of the linear layers are reordered from grouped to tiled (see
//    Qwen35Config::tiled_v): in attn_qkv's v rows, attn_gate (z), ssm_beta / ssm_alpha rows,
//    ssm_a, ssm_dt.bias, ssm_conv1d's v channels and ssm_out's columns. All of them
//    consistently, so the model is the same with key head g read by value heads g, g + nk, ...
//    (adopted: ssm_out's columns could not be permuted back inside quantized blocks);
//  - ssm_a holds -exp(A_log) (what DeltaNetWeights::neg_a is), conv1d is squeezed to
//    [conv_dim, kernel], dt_bias is ssm_dt.bias;
//  - every RMSNorm weight except the linear layers' gated ssm_norm holds 1 + w (folded in, as
//    here);
//  - q_proj stays attn_q with each head's query rows then its gate rows (regrouped below, row
//    runs of the stored blocks: exact for quantized files), k and v apart;
//  - experts as ffn_{gate,up,down}_exps [E, F, H] / [E, H, F] (dequantized to float here:
//    gather_mm has no GGUF block types), the router ffn_gate_inp, the shared expert *_shexp and
//    its gate ffn_gate_inp_shexp;
//  - the MTP head (qwen35moe.nextn_predict_layers) as the last block: nextn.eh_proj (fc),
//    nextn.enorm / hnorm (the embedding's and the hidden state's norms), nextn.shared_head_norm,
//    and the block's own full-attention layer and MoE.
std::unique_ptr<Model> load_qwen35_gguf(const GgufFile& file, const LoadOptions& options, bool dense) {
  const Metadata& m = file.metadata();
  const std::string gguf_arch = dense ? "qwen35" : "qwen35moe";
  const std::string p = gguf_arch + ".";
  const auto ints = [&](const std::string& key) -> std::vector<int64_t> {
    if (!m.has(key)) return {};
    const auto* v = std::get_if<std::vector<int64_t>>(&m.values().at(key));
    if (!v) throw std::runtime_error("qwen35moe metadata " + key + " is not an array of integers");
    return *v;
  };
  Qwen35Config c;
  DecoderDims& d = c.dims;
  const int n_mtp = static_cast<int>(m.get_int(p + "nextn_predict_layers").value_or(0));
  d.n_layers = static_cast<int>(m.require_int(p + "block_count")) - n_mtp;
  d.hidden_size = static_cast<int>(m.require_int(p + "embedding_length"));
  d.n_heads = static_cast<int>(m.require_int(p + "attention.head_count"));
  d.n_kv_heads = static_cast<int>(m.get_int(p + "attention.head_count_kv").value_or(d.n_heads));
  d.head_dim = static_cast<int>(m.get_int(p + "attention.key_length").value_or(256));
  d.rms_eps = static_cast<float>(m.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  d.context_length = static_cast<int>(m.get_int(p + "context_length").value_or(32768));
  const TensorView& embd = file.tensor("token_embd.weight");
  d.vocab_size = static_cast<int>(embd.shape[1]);
  c.dense = dense;
  if (dense) {
    d.ffn_size = static_cast<int>(m.require_int(p + "feed_forward_length"));
  } else {
    d.ffn_size = static_cast<int>(m.require_int(p + "expert_feed_forward_length"));
    c.shared_ffn = static_cast<int>(m.require_int(p + "expert_shared_feed_forward_length"));
    c.n_experts = static_cast<int>(m.require_int(p + "expert_count"));
    c.top_k = static_cast<int>(m.require_int(p + "expert_used_count"));
  }
  c.conv_kernel = static_cast<int>(m.require_int(p + "ssm.conv_kernel"));
  c.k_dim = static_cast<int>(m.require_int(p + "ssm.state_size"));
  c.k_heads = static_cast<int>(m.require_int(p + "ssm.group_count"));
  c.v_heads = static_cast<int>(m.require_int(p + "ssm.time_step_rank"));
  c.v_dim = c.v_heads > 0 ? static_cast<int>(m.require_int(p + "ssm.inner_size")) / c.v_heads : 0;
  c.tiled_v = true;
  d.check(gguf_arch);
  if (n_mtp < 0 || n_mtp > 1) {
    throw std::runtime_error(gguf_arch + " with " + std::to_string(n_mtp) + " MTP layers is not supported (expected 0 or 1)");
  }
  if ((!dense && (c.n_experts <= 0 || c.top_k <= 0 || c.top_k > c.n_experts || c.shared_ffn <= 0)) ||
      c.k_heads <= 0 || c.v_heads <= 0 || c.v_heads % c.k_heads != 0 || c.k_dim <= 0 || c.v_dim <= 0 ||
      c.conv_kernel < 2) {
    throw std::runtime_error("inconsistent " + gguf_arch + " hyperparameters (experts, top-k or linear attention)");
  }
  const std::vector<int64_t> recurrent = ints(p + "attention.recurrent_layers");
  const int every = static_cast<int>(m.get_int(p + "full_attention_interval").value_or(4));
  for (int i = 0; i < d.n_layers; ++i) {
    c.linear.push_back(recurrent.empty() ? (i + 1) % every != 0 : recurrent.at(i) != 0);
  }
  c.rope_dims = static_cast<int>(m.get_int(p + "rope.dimension_count").value_or(d.head_dim / 4));
  if (c.rope_dims <= 0 || c.rope_dims % 2 != 0 || c.rope_dims > d.head_dim) {
    throw std::runtime_error("qwen35moe rope.dimension_count " + std::to_string(c.rope_dims) + " is not supported");
  }
  std::array<int, 3> section = {11, 11, 10};
  const std::vector<int64_t> sections = ints(p + "rope.dimension_sections");
  for (size_t a = 0; a < 3 && a < sections.size(); ++a) section[a] = static_cast<int>(sections[a]);
  set_rope_axes(c, section);
  if (const auto scaling = m.get_string(p + "rope.scaling.type"); scaling && *scaling != "none") {
    throw std::runtime_error("qwen35moe rope scaling type '" + *scaling + "' is not supported yet");
  }
  auto rope = std::make_shared<Rope>();
  rope->dims = c.rope_dims;
  rope->interleaved = false;  // rotate-half (llama.cpp's IMROPE is NEOX-style)
  rope->inv_freq = rope_inv_freq(c.rope_dims, m.get_float(p + "rope.freq_base").value_or(10000000.0));

  const bool dev = options.on_device();
  const mx::Dtype expert_dtype = dev ? device_compute_dtype() : mx::float32;
  const auto t = [&](const std::string& name) -> const TensorView* { return &file.tensor(name); };
  const auto vec = [&](const std::string& name) { return dequantize_tensor(file.tensor(name)); };
  auto load_layer = [&](int i, bool linear, int slot) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const std::string what = "block " + std::to_string(i);
    Layer L;
    L.linear = linear;
    L.slot = slot;
    L.in_norm = vec(b + "attn_norm.weight");
    L.post_norm = vec(b + "post_attention_norm.weight");
    if (linear) {
      L.dn.in_proj = Linear::from_gguf({t(b + "attn_qkv.weight"), t(b + "attn_gate.weight"), t(b + "ssm_beta.weight"),
                                        t(b + "ssm_alpha.weight")},
                                       false, dev);
      if (L.dn.in_proj.out_features() != c.conv_dim() + c.v_heads * c.v_dim + 2 * c.v_heads) {
        throw std::runtime_error("qwen35moe linear attention projections of " + what + " do not match the head counts");
      }
      mx::array conv = vec(b + "ssm_conv1d.weight");  // [conv_dim, kernel]
      if (conv.shape() != mx::Shape{c.conv_dim(), c.conv_kernel}) {
        throw std::runtime_error("qwen35moe ssm_conv1d of " + what + " is not [conv_dim, conv_kernel]");
      }
      L.dn.conv = mx::contiguous(mx::transpose(conv));
      L.dn.neg_a = vec(b + "ssm_a");
      L.dn.dt_bias = vec(b + "ssm_dt.bias");
      L.dn.norm = vec(b + "ssm_norm.weight");
      L.dn.out = Linear::from_gguf({t(b + "ssm_out.weight")}, false, dev);
      mx::eval({L.dn.conv});
    } else {
      // attn_q's rows are per head [query (head_dim), gate (head_dim)]: views of each head's
      // two row runs, stacked as all queries | k | v | all gates.
      const TensorView& q = file.tensor(b + "attn_q.weight");
      if (q.shape.size() != 2 || q.shape[1] != 2LL * d.n_heads * d.head_dim) {
        throw std::runtime_error("qwen35moe attn_q of " + what + " is not [2 * heads * head_dim, hidden]");
      }
      const size_t row = q.n_bytes / static_cast<size_t>(q.shape[1]);
      std::vector<TensorView> runs;
      for (int which = 0; which < 2; ++which) {
        for (int h = 0; h < d.n_heads; ++h) {
          TensorView v = q;
          v.name = q.name + (which ? ".gate." : ".query.") + std::to_string(h);
          v.shape = {q.shape[0], d.head_dim};
          v.data = q.data + (static_cast<size_t>(2 * h + which) * d.head_dim) * row;
          v.n_bytes = row * d.head_dim;
          runs.push_back(std::move(v));
        }
      }
      std::vector<const TensorView*> parts;
      for (int h = 0; h < d.n_heads; ++h) parts.push_back(&runs[h]);
      parts.push_back(t(b + "attn_k.weight"));
      parts.push_back(t(b + "attn_v.weight"));
      for (int h = 0; h < d.n_heads; ++h) parts.push_back(&runs[d.n_heads + h]);
      L.attn.qkvg = Linear::from_gguf(parts, false, dev);
      L.attn.q_norm = vec(b + "attn_q_norm.weight");
      L.attn.k_norm = vec(b + "attn_k_norm.weight");
      L.attn.wo = Linear::from_gguf({t(b + "attn_output.weight")}, false, dev);
    }
    if (dense) {
      L.mlp_gate_up = Linear::from_gguf({t(b + "ffn_gate.weight"), t(b + "ffn_up.weight")}, /*interleave_pairs=*/true, dev);
      L.mlp_down = Linear::from_gguf({t(b + "ffn_down.weight")}, false, dev);
      return L;
    }
    // The shared expert's gate is one row; llama-quantize writes it back 1-D ({hidden}).
    TensorView shexp_gate = file.tensor(b + "ffn_gate_inp_shexp.weight");
    if (shexp_gate.shape.size() == 1) shexp_gate.shape.push_back(1);
    L.moe.router = Linear::from_gguf({t(b + "ffn_gate_inp.weight"), &shexp_gate}, false, dev);
    const bool merged = file.find(b + "ffn_gate_up_exps.weight") != nullptr;
    const std::vector<int64_t> up_shape = {d.hidden_size, (merged ? 2 : 1) * d.ffn_size, c.n_experts};
    for (const char* name : {"ffn_gate_up_exps", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      if (merged != (std::string(name) == "ffn_gate_up_exps") && std::string(name) != "ffn_down_exps") continue;
      const std::vector<int64_t> want =
          std::string(name) == "ffn_down_exps" ? std::vector<int64_t>{d.ffn_size, d.hidden_size, c.n_experts} : up_shape;
      if (file.tensor(b + name + ".weight").shape != want) {
        throw std::runtime_error("qwen35moe " + std::string(name) + " of " + what +
                                 " does not match expert_count x expert_feed_forward_length");
      }
    }
    if (!SkipWeightBytes::active()) {  // the pull-time check keeps no bytes: no float experts either
      mx::array gate_up = merged ? vec(b + "ffn_gate_up_exps.weight")
                                 : mx::concatenate({vec(b + "ffn_gate_exps.weight"), vec(b + "ffn_up_exps.weight")}, 1);
      set_float_experts(L.moe, gate_up, vec(b + "ffn_down_exps.weight"), c, expert_dtype, what);
    }
    L.moe.shared_gate_up =
        Linear::from_gguf({t(b + "ffn_gate_shexp.weight"), t(b + "ffn_up_shexp.weight")}, /*interleave_pairs=*/true, dev);
    L.moe.shared_down = Linear::from_gguf({t(b + "ffn_down_shexp.weight")}, false, dev);
    return L;
  };
  std::vector<Layer> layers(d.n_layers);
  int n_linear = 0, n_full = 0;
  for (int i = 0; i < d.n_layers; ++i) layers[i] = load_layer(i, c.linear[i], c.linear[i] ? n_linear++ : n_full++);
  mx::array out_norm = vec("output_norm.weight");
  const TensorView* output = file.find("output.weight");
  Linear lm_head = Linear::from_gguf({output ? output : &embd}, false, dev);
  Embedding embed = (!output && lm_head.quantized() && !dev) ? Embedding::tied_to(lm_head)
                                                             : Embedding(copy_bytes(embd), embd.type, d.hidden_size);
  std::optional<MtpWeights> mtp;
  if (n_mtp == 1) {
    const std::string b = "blk." + std::to_string(d.n_layers) + ".nextn.";
    MtpWeights& h = mtp.emplace();
    h.pre_embedding = vec(b + "enorm.weight");
    h.pre_hidden = vec(b + "hnorm.weight");
    h.fc = Linear::from_gguf({t(b + "eh_proj.weight")}, false, dev);
    if (h.fc.out_features() != d.hidden_size) {
      throw std::runtime_error("qwen35moe nextn.eh_proj does not map 2 x hidden_size to hidden_size");
    }
    h.layer = load_layer(d.n_layers, false, 0);
    h.norm = file.find(b + "shared_head_norm.weight") ? vec(b + "shared_head_norm.weight") : out_norm;
  }
  // Named by the experts' (or the MLP's) type: the bulk of the weights (llama-quantize leaves the
  // narrow ones in F16).
  const TensorView* bulk = file.find(dense ? "blk.0.ffn_up.weight" : "blk.0.ffn_up_exps.weight");
  if (!bulk) bulk = &file.tensor("blk.0.ffn_gate_up_exps.weight");
  ModelInfo info = make_info(d, dense ? "qwen3_5" : "qwen3_5_moe", "gguf:" + type_name(bulk->type), options);
  info.weight_bytes = file.file_size();
  return std::make_unique<Qwen35MoeModel>(c, info, std::move(layers), out_norm, std::move(lm_head), std::move(embed),
                                          rope, expert_dtype, std::move(mtp));
}

}  // namespace

std::unique_ptr<Model> load_qwen3_5_moe_safetensors(const std::string& dir, const Metadata& hf,
                                                    const LoadOptions& options) {
  return load_qwen35_safetensors(dir, hf, options, /*dense=*/false);
}

std::unique_ptr<Model> load_qwen3_5_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  return load_qwen35_safetensors(dir, hf, options, /*dense=*/true);
}

std::unique_ptr<Model> load_qwen3_5_moe_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_qwen35_gguf(file, options, /*dense=*/false);
}

std::unique_ptr<Model> load_qwen3_5_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_qwen35_gguf(file, options, /*dense=*/true);
}

}  // namespace llmd
