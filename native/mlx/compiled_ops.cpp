#include "compiled_ops.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace llmd {

namespace {

using Fn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// One compiled function per key (the constants its trace bakes in). The map is never freed: a
// compiled closure erases its entry from MLX's compile cache when destroyed, and at exit that
// cache may already be gone.
template <class Key>
const Fn& compiled(const Key& key, const std::function<Fn()>& make) {
  static std::mutex mutex;
  static auto* fns = new std::map<Key, Fn>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = fns->find(key);
  if (it == fns->end()) it = fns->emplace(key, make()).first;
  return it->second;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

mx::array gelu_tanh_ops(const mx::array& g) {
  const float c = std::sqrt(2.f / static_cast<float>(M_PI));
  mx::array cube = mx::multiply(mx::multiply(g, g), g);
  mx::array inner = mx::multiply(mx::array(c), mx::add(g, mx::multiply(mx::array(0.044715f), cube)));
  return mx::multiply(mx::multiply(mx::array(0.5f), g), mx::add(mx::array(1.f), mx::tanh(inner)));
}

}  // namespace

mx::array rms_norm(const mx::array& x, const mx::array& w, float eps) {
  const Fn& fn = compiled(std::make_pair(0, bits_of(eps)), [eps] {
    return mx::compile(
        [eps](const std::vector<mx::array>& in) {
          return std::vector<mx::array>{mx::fast::rms_norm(in[0], in[1], eps)};
        },
        /*shapeless=*/true);
  });
  return fn({x, w})[0];
}

mx::array rms_norm_heads(const mx::array& x, const std::optional<mx::array>& w, int heads, int head_dim, float eps) {
  // Unflatten/Flatten, not Reshape: they infer their output shapes from the input's, which
  // shapeless compile needs; the head count is fixed per function, so the rows may vary.
  const bool weighted = w.has_value();
  const Fn& fn = compiled(std::make_tuple(heads, head_dim, bits_of(eps), weighted), [=] {
    return mx::compile(
        [=](const std::vector<mx::array>& in) {
          const mx::array h = mx::unflatten(in[0], 1, {heads, head_dim});
          const std::optional<mx::array> weight = weighted ? std::optional<mx::array>(in[1]) : std::nullopt;
          return std::vector<mx::array>{mx::flatten(mx::fast::rms_norm(h, weight, eps), 1, 2)};
        },
        /*shapeless=*/true);
  });
  return fn(weighted ? std::vector<mx::array>{x, *w} : std::vector<mx::array>{x})[0];
}

mx::array silu_mul(const mx::array& g, const mx::array& u) {
  static const auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        return std::vector<mx::array>{mx::multiply(mx::multiply(in[0], mx::sigmoid(in[0])), in[1])};
      },
      /*shapeless=*/true);
  return fn({g, u})[0];
}

mx::array gelu_tanh(const mx::array& g) {
  static const auto fn = mx::compile(
      [](const std::vector<mx::array>& in) { return std::vector<mx::array>{gelu_tanh_ops(in[0])}; },
      /*shapeless=*/true);
  return fn({g})[0];
}

mx::array gelu_tanh_mul(const mx::array& g, const mx::array& u) {
  static const auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        return std::vector<mx::array>{mx::multiply(gelu_tanh_ops(in[0]), in[1])};
      },
      /*shapeless=*/true);
  return fn({g, u})[0];
}

mx::array softcap(const mx::array& x, float cap) {
  const Fn& fn = compiled(std::make_pair(1, bits_of(cap)), [cap] {
    return mx::compile(
        [cap](const std::vector<mx::array>& in) {
          return std::vector<mx::array>{
              mx::multiply(mx::tanh(mx::multiply(in[0], mx::array(1.f / cap))), mx::array(cap))};
        },
        /*shapeless=*/true);
  });
  return fn({x})[0];
}

std::pair<mx::array, mx::array> quantize_kv_rows(const mx::array& x, KvType type) {
  // Unflatten/Flatten and a weighted sum for the nibble packing (not Reshape and Slice): every
  // op infers its output shape from its inputs, as shapeless compile needs.
  const int width = x.shape(1), blocks = width / 32;
  const Fn& fn = compiled(std::make_tuple(0, static_cast<int>(type), width), [=] {
    return mx::compile(
        [=](const std::vector<mx::array>& in) {
          const mx::array b = mx::unflatten(mx::astype(in[0], mx::float32), 1, {blocks, 32});
          const mx::array zero(0.f);
          if (type == KvType::Q8_0) {
            const mx::array d = mx::divide(mx::max(mx::abs(b), -1, true), mx::array(127.f));
            const mx::array id = mx::where(mx::equal(d, zero), zero, mx::reciprocal(d));
            // roundf: halves away from zero (mx::round rounds them to even).
            const mx::array y = mx::multiply(b, id);
            const mx::array q = mx::multiply(mx::sign(y), mx::floor(mx::add(mx::abs(y), mx::array(0.5f))));
            return std::vector<mx::array>{mx::flatten(mx::astype(q, mx::int8), 1, 2),
                                          mx::flatten(mx::astype(d, mx::float16), 1, 2)};
          }
          // q4_0: d = (the number of largest magnitude) / -8; code = min(15, trunc(x / d + 8.5)).
          const mx::array m = mx::take_along_axis(b, mx::argmax(mx::abs(b), -1, true), -1);
          const mx::array d = mx::divide(m, mx::array(-8.f));
          const mx::array id = mx::where(mx::equal(d, zero), zero, mx::reciprocal(d));
          const mx::array q = mx::astype(
              mx::minimum(mx::floor(mx::add(mx::multiply(b, id), mx::array(8.5f))), mx::array(15.f)), mx::uint8);
          // Byte j of a block: code j in the low nibble, code j + 16 in the high one.
          const mx::array halves = mx::unflatten(q, 2, {2, 16});
          const mx::array nibble = mx::array({1, 16}, {2, 1}, mx::uint8);
          const mx::array packed = mx::astype(mx::sum(mx::multiply(halves, nibble), 2), mx::uint8);
          return std::vector<mx::array>{mx::flatten(packed, 1, 2), mx::flatten(mx::astype(d, mx::float16), 1, 2)};
        },
        /*shapeless=*/true);
  });
  std::vector<mx::array> out = fn({x});
  return {out[0], out[1]};
}

mx::array dequantize_kv_rows(const mx::array& codes, const mx::array& scales, KvType type, mx::Dtype dt) {
  const int blocks = scales.shape(1);
  const auto key = std::make_tuple(1, static_cast<int>(type), blocks, static_cast<int>(dt.val()));
  const Fn& fn = compiled(key, [=] {
    return mx::compile(
        [=](const std::vector<mx::array>& in) {
          mx::array q = mx::unflatten(in[0], 1, {blocks, type == KvType::Q8_0 ? 32 : 16});
          if (type == KvType::Q4_0) {
            const mx::array lo = mx::bitwise_and(q, mx::array(15, mx::uint8));
            const mx::array hi = mx::right_shift(q, mx::array(4, mx::uint8));
            q = mx::subtract(mx::astype(mx::concatenate({lo, hi}, -1), mx::float32), mx::array(8.f));
          }
          const mx::array x =
              mx::multiply(mx::astype(q, mx::float32), mx::expand_dims(mx::astype(in[1], mx::float32), -1));
          return std::vector<mx::array>{mx::astype(mx::flatten(x, 1, 2), dt)};
        },
        /*shapeless=*/true);
  });
  return fn({codes, scales})[0];
}

RopedRows rope_rows(const mx::array& x, const mx::array& positions, const mx::array& freqs, const Rope& rope,
                    int heads, int kv_heads, int head_dim, bool with_kv) {
  // Per shape, not shapeless: the slices and reshapes carry their shapes as parameters.
  const auto key = std::make_tuple(rope.dims, rope.interleaved, heads, kv_heads, head_dim, with_kv);
  const Fn& fn = compiled(key, [=, dims = rope.dims, interleaved = rope.interleaved] {
    return mx::compile(
        [=](const std::vector<mx::array>& in) {
          const mx::array& x = in[0];
          const int rows = x.shape(0), hd = head_dim, H = heads, KVH = kv_heads;
          const int qw = H * hd, kw = KVH * hd;
          // Queries and keys rotated together: [rows, heads, 1, hd].
          const int rotated = with_kv ? H + KVH : H;
          mx::array qk = mx::reshape(mx::slice(x, {0, 0}, {rows, rotated * hd}), {rows, rotated, 1, hd});
          qk = mx::fast::rope(qk, dims, interleaved, std::nullopt, 1.f, in[1], in[2]);
          if (!with_kv) return std::vector<mx::array>{qk};
          return std::vector<mx::array>{mx::slice(qk, {0, 0, 0, 0}, {rows, H, 1, hd}),
                                        mx::reshape(mx::slice(qk, {0, H, 0, 0}, {rows, H + KVH, 1, hd}), {rows, kw}),
                                        mx::slice(x, {0, qw + kw}, {rows, qw + 2 * kw})};
        },
        /*shapeless=*/false);
  });
  std::vector<mx::array> out = fn({x, positions, freqs});
  if (!with_kv) return {out[0], mx::array(0.f), mx::array(0.f)};
  return {out[0], out[1], out[2]};
}

}  // namespace llmd
