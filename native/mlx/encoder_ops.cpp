#include "encoder_ops.h"

#include <mlx/backend/cpu/encoder.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../core/kv_cache.h"
#include "../core/op_profile.h"
#include "../core/thread_pool.h"
#include "attention_kernels.h"
#include "row_major.h"
#include "simd.h"

namespace llmd {

// Row kernels, cloned per ISA (simd.h). Not in an anonymous namespace: target_clones needs
// the functions' symbols for its resolvers.
namespace encoder_rows {
using namespace simd;

// erfc(z) for z >= 0 (Numerical Recipes' erfcc: fractional error < 1.2e-7 everywhere).
[[gnu::always_inline]] inline vf erfc_nonneg(vf z) {
  const vf t = 1.f / (1.f + 0.5f * z);
  vf p = splat(0.17087277f);
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * vexp(p - z * z);
}

// gelu(x) = x/2 * (1 + erf(x / sqrt 2)); for x < 0 that is x/2 * erfc(|x| / sqrt 2), which
// keeps its relative precision where the value is tiny.
[[gnu::always_inline]] inline vf gelu_erf(vf x) {
  const vf c = erfc_nonneg((x < 0.f ? -x : x) * 0.70710678118654752f);
  return 0.5f * x * (x < 0.f ? c : 2.f - c);
}

// The tanh form (simd.h).
[[gnu::always_inline]] inline vf gelu_tanh(vf x) { return gelu_tanh_n<vf, vfi>(x); }

// A row's vectors: whole ones loaded and stored directly, the tail through a zero-padded
// copy that goes through the same arithmetic (a variable-length memcpy per vector cost more
// than the maths).
template <typename F>
[[gnu::always_inline]] inline void each_vector(int n, F&& f) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, n - i);
}

[[gnu::always_inline]] inline vf load_part(const float* p, int m) {
  if (m == kLanes) return load(p);
  vf v{};
  for (int l = 0; l < m; ++l) v[l] = p[l];
  return v;
}

[[gnu::always_inline]] inline void store_part(float* p, vf v, int m) {
  if (m == kLanes) return store(p, v);
  for (int l = 0; l < m; ++l) p[l] = v[l];
}

LLMD_CLONES
void gelu_row(const float* x, const float* bias, float* out, int n, bool tanh_approx) {
  each_vector(n, [&](int i, int m) __attribute__((always_inline)) {
    vf v = load_part(x + i, m);
    if (bias) v += load_part(bias + i, m);
    store_part(out + i, tanh_approx ? gelu_tanh(v) : gelu_erf(v), m);
  });
}

[[gnu::always_inline]] inline float hsum(vf v) {
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// out = LN(x + bias + residual) * w + shift for one row (bias, residual may be null).
LLMD_CLONES
void add_layer_norm_row(const float* x, const float* bias, const float* residual, const float* w, const float* shift,
                        float eps, float* out, int n) {
  vf acc{};
  each_vector(n, [&](int i, int m) __attribute__((always_inline)) {
    vf v = load_part(x + i, m);
    if (bias) v += load_part(bias + i, m);
    if (residual) v += load_part(residual + i, m);
    acc += v;
    store_part(out + i, v, m);
  });
  const float mean = hsum(acc) / static_cast<float>(n);
  vf sq{};
  each_vector(n, [&](int i, int m) __attribute__((always_inline)) {
    vf v = load_part(out + i, m) - mean;
    for (int l = m; l < kLanes; ++l) v[l] = 0.f;  // padding lanes add nothing
    sq += v * v;
  });
  const float inv = 1.f / std::sqrt(hsum(sq) / static_cast<float>(n) + eps);
  each_vector(n, [&](int i, int m) __attribute__((always_inline)) {
    const vf v = load_part(out + i, m);
    store_part(out + i, (v - mean) * inv * load_part(w + i, m) + load_part(shift + i, m), m);
  });
}

}  // namespace encoder_rows

namespace {

const auto cpu_stream = [] { return mx::default_stream(mx::Device::cpu); };

// Rows per task for a row-wise op: enough work per task to outweigh a wake-up.
int row_tasks(int rows, int n) { return std::max(1, std::min(rows, rows * n / 16384 + 1)); }

class BiasGelu : public mx::UnaryPrimitive {
 public:
  BiasGelu(mx::Stream s, bool has_bias, bool tanh_approx)
      : mx::UnaryPrimitive(s), has_bias_(has_bias), tanh_(tanh_approx) {}
  const char* name() const override { return "LlmdBiasGelu"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const BiasGelu&>(other);
    return o.has_bias_ == has_bias_ && o.tanh_ == tanh_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("LlmdBiasGelu has no GPU kernel");
  }
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, has_bias = has_bias_, tanh_approx = tanh_]() mutable {
      const RowMajor x(inputs[0]);
      const std::optional<RowMajor> bias = has_bias ? std::optional<RowMajor>(inputs[1]) : std::nullopt;
      const int rows = inputs[0].shape(0), n = inputs[0].shape(1);
      const float* xp = x.data();
      const float* bp = bias ? bias->data() : nullptr;
      float* op = out.data<float>();
      const int tasks = row_tasks(rows, n);
      ThreadPool::global().parallel_for(tasks, [&](int t0, int t1) {
        for (int r = rows * t0 / tasks; r < rows * t1 / tasks; ++r) {
          const size_t off = static_cast<size_t>(r) * n;
          encoder_rows::gelu_row(xp + off, bp, op + off, n, tanh_approx);
        }
      });
    });
  }

 private:
  bool has_bias_, tanh_;
};

class AddLayerNorm : public mx::UnaryPrimitive {
 public:
  AddLayerNorm(mx::Stream s, bool has_bias, bool has_residual, float eps)
      : mx::UnaryPrimitive(s), has_bias_(has_bias), has_residual_(has_residual), eps_(eps) {}
  const char* name() const override { return "LlmdAddLayerNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const AddLayerNorm&>(other);
    return o.has_bias_ == has_bias_ && o.has_residual_ == has_residual_ && o.eps_ == eps_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("LlmdAddLayerNorm has no GPU kernel");
  }
  // inputs: x, weight, shift, [bias], [residual]
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, has_bias = has_bias_, has_residual = has_residual_, eps = eps_]() mutable {
      const RowMajor x(inputs[0]), w(inputs[1]), s(inputs[2]);
      size_t next = 3;
      const std::optional<RowMajor> bias = has_bias ? std::optional<RowMajor>(inputs[next++]) : std::nullopt;
      const std::optional<RowMajor> res = has_residual ? std::optional<RowMajor>(inputs[next]) : std::nullopt;
      const int rows = inputs[0].shape(0), n = inputs[0].shape(1);
      float* op = out.data<float>();
      const int tasks = row_tasks(rows, n);
      ThreadPool::global().parallel_for(tasks, [&](int t0, int t1) {
        for (int r = rows * t0 / tasks; r < rows * t1 / tasks; ++r) {
          const size_t off = static_cast<size_t>(r) * n;
          encoder_rows::add_layer_norm_row(x.data() + off, bias ? bias->data() : nullptr,
                                           res ? res->data() + off : nullptr, w.data(), s.data(), eps, op + off, n);
        }
      });
    });
  }

 private:
  bool has_bias_, has_residual_;
  float eps_;
};

class EncoderAttention : public mx::UnaryPrimitive {
 public:
  EncoderAttention(mx::Stream s, std::shared_ptr<const EncoderSpans> spans, int heads, int head_dim,
                   std::shared_ptr<const Rope> rope, bool has_bias)
      : mx::UnaryPrimitive(s),
        spans_(std::move(spans)),
        heads_(heads),
        hd_(head_dim),
        rope_(std::move(rope)),
        has_bias_(has_bias) {}
  const char* name() const override { return "LlmdEncoderAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const EncoderAttention&>(other);
    return o.spans_ == spans_ && o.heads_ == heads_ && o.hd_ == hd_ && o.rope_ == rope_ && o.has_bias_ == has_bias_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[0].shape(0), heads_ * hd_}};
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("LlmdEncoderAttention has no GPU kernel");
  }
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, spans = spans_, H = heads_, hd = hd_, rope = rope_, has_bias = has_bias_]() mutable {
      ScopedOpTimer timer(OpKind::Attention);
      run(inputs, out, *spans, H, hd, rope.get(), has_bias);
    });
  }

 private:
  // Phase 1 writes each span's keys (transposed) and values into KV-tile blocks of
  // kBlockTokens positions, as the paged decoder attention reads them, and the rotated,
  // pre-scaled queries into a scratch copy; phase 2 runs one task per tile of up to
  // kMaxTileRows queries of one head and span, each over the span's whole length.
  static void run(const std::vector<mx::array>& inputs, mx::array& out, const EncoderSpans& spans, int H, int hd,
                  const Rope* rope, bool has_bias) {
    constexpr int BT = KvPool::kBlockTokens;
    const int W = H * hd;
    const RowMajor qkv(inputs[0]);
    const std::optional<RowMajor> bias_rows = has_bias ? std::optional<RowMajor>(inputs[1]) : std::nullopt;
    const float* bias = bias_rows ? bias_rows->data() : nullptr;
    const float* in = qkv.data();
    const int rows = inputs[0].shape(0);
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    struct RowRef {
      int span, pos;
    };
    std::vector<RowRef> row_of(rows);
    std::vector<int> block0(spans.size() + 1, 0);  // first KV block of each span
    for (size_t s = 0; s < spans.size(); ++s) {
      const auto [first, n] = spans[s];
      for (int i = 0; i < n; ++i) row_of[first + i] = {static_cast<int>(s), i};
      block0[s + 1] = block0[s] + (n + BT - 1) / BT;
    }
    const size_t block_floats = static_cast<size_t>(hd) * BT;
    // Zeroed: a span's last block is only partly written and the kernel reads whole tiles.
    thread_local std::vector<float> keys, values, queries;
    keys.assign(static_cast<size_t>(block0.back()) * H * block_floats, 0.f);
    values.assign(keys.size(), 0.f);
    queries.resize(static_cast<size_t>(rows) * W);
    float* kp = keys.data();
    float* vp = values.data();
    float* qp = queries.data();
    auto& threads = ThreadPool::global();
    const int half = rope ? rope->dims / 2 : 0;
    threads.parallel_for(rows, [&](int r0, int r1) {
      std::vector<float> q(hd), k(hd), cos_t(half), sin_t(half);
      for (int row = r0; row < r1; ++row) {
        const auto [s, pos] = row_of[row];
        const float* src = in + static_cast<size_t>(row) * 3 * W;
        if (rope) rope->tables(pos, cos_t.data(), sin_t.data());
        const size_t block = static_cast<size_t>(block0[s] + pos / BT) * H;
        const int off = pos % BT;
        for (int h = 0; h < H; ++h) {
          for (int d = 0; d < hd; ++d) {
            const int qi = h * hd + d, ki = W + qi, vi = 2 * W + qi;
            q[d] = src[qi] + (bias ? bias[qi] : 0.f);
            k[d] = src[ki] + (bias ? bias[ki] : 0.f);
            vp[(block + h) * block_floats + static_cast<size_t>(off) * hd + d] = src[vi] + (bias ? bias[vi] : 0.f);
          }
          if (rope) {
            rope->rotate(q.data(), cos_t.data(), sin_t.data());
            rope->rotate(k.data(), cos_t.data(), sin_t.data());
          }
          float* kt = kp + (block + h) * block_floats;
          for (int d = 0; d < hd; ++d) kt[static_cast<size_t>(d) * BT + off] = k[d];
          float* qd = qp + static_cast<size_t>(row) * W + h * hd;
          for (int d = 0; d < hd; ++d) qd[d] = q[d] * scale;
        }
      }
    });
    struct Tile {
      int span, row0, n_rows, head;
    };
    std::vector<Tile> tiles;
    for (size_t s = 0; s < spans.size(); ++s) {
      const auto [first, n] = spans[s];
      for (int i = 0; i < n; i += kMaxTileRows) {
        for (int h = 0; h < H; ++h) tiles.push_back({static_cast<int>(s), first + i, std::min(kMaxTileRows, n - i), h});
      }
    }
    float* o = out.data<float>();
    const AttendTileFn attend = attention_kernels().attend_f32;
    const int tasks = static_cast<int>(tiles.size());
    threads.parallel_for_dynamic(tasks, [&](int t0, int t1) {
      AttentionTileScratch& scratch = attention_tile_scratch(hd);
      auto& kb = scratch.k_blocks;
      auto& vb = scratch.v_blocks;
      for (int t = t0; t < t1; ++t) {
        const Tile& tile = tiles[t];
        const int n = spans[tile.span].second;
        AttentionTile at;
        at.rows = tile.n_rows;
        for (int r = 0; r < tile.n_rows; ++r) {
          const size_t row = static_cast<size_t>(tile.row0 + r);
          at.q[r] = qp + row * W + tile.head * hd;
          at.n_pos[r] = n;  // bidirectional: every query sees its whole span
          at.out[r] = o + row * W + tile.head * hd;
        }
        const int nb = (n + BT - 1) / BT;
        kb.resize(nb);
        vb.resize(nb);
        for (int b = 0; b < nb; ++b) {
          const size_t block = (static_cast<size_t>(block0[tile.span] + b) * H + tile.head) * block_floats;
          kb[b] = kp + block;
          vb[b] = vp + block;
        }
        attend(at, kb.data(), vb.data(), hd, BT, scratch.floats.data());
      }
    });
  }

  std::shared_ptr<const EncoderSpans> spans_;
  int heads_, hd_;
  std::shared_ptr<const Rope> rope_;
  bool has_bias_;
};

}  // namespace

bool supports_encoder_attention(int head_dim) { return head_dim % 16 == 0; }

mx::array encoder_attention(const mx::array& qkv, const std::optional<mx::array>& bias,
                            std::shared_ptr<const EncoderSpans> spans, int heads, int head_dim,
                            std::shared_ptr<const Rope> rope) {
  if (!supports_encoder_attention(head_dim)) {
    throw std::invalid_argument("encoder_attention: head_dim must be a multiple of 16");
  }
  if (qkv.ndim() != 2 || qkv.shape(1) != 3 * heads * head_dim) {
    throw std::invalid_argument("encoder_attention: qkv must be [rows, " + std::to_string(3 * heads * head_dim) + "]");
  }
  const auto s = cpu_stream();
  std::vector<mx::array> in{float32_input(qkv, s)};
  if (bias) in.push_back(float32_input(*bias, s));
  return mx::array({qkv.shape(0), heads * head_dim}, mx::float32,
                   std::make_shared<EncoderAttention>(s, std::move(spans), heads, head_dim, std::move(rope),
                                                      bias.has_value()),
                   std::move(in));
}

mx::array bias_gelu(const mx::array& x, const std::optional<mx::array>& bias, bool tanh_approx) {
  if (x.ndim() != 2) throw std::invalid_argument("bias_gelu: x must be 2-D");
  const auto s = cpu_stream();
  std::vector<mx::array> in{float32_input(x, s)};
  if (bias) in.push_back(float32_input(*bias, s));
  return mx::array(x.shape(), mx::float32, std::make_shared<BiasGelu>(s, bias.has_value(), tanh_approx),
                   std::move(in));
}

mx::array add_layer_norm(const mx::array& x, const std::optional<mx::array>& bias,
                         const std::optional<mx::array>& residual, const mx::array& weight, const mx::array& shift,
                         float eps) {
  if (x.ndim() != 2) throw std::invalid_argument("add_layer_norm: x must be 2-D");
  const auto s = cpu_stream();
  std::vector<mx::array> in{float32_input(x, s), float32_input(weight, s), float32_input(shift, s)};
  if (bias) in.push_back(float32_input(*bias, s));
  if (residual) in.push_back(float32_input(*residual, s));
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<AddLayerNorm>(s, bias.has_value(), residual.has_value(), eps), std::move(in));
}

}  // namespace llmd
