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
