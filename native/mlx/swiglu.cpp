#include "swiglu.h"

#include "simd.h"

namespace llmd {

namespace {
using namespace simd;

// silu(g) * u = g * u / (1 + exp(-g)) for one vector of pairs.
[[gnu::always_inline]] inline vf swiglu(vf g, vf u) { return g * u / (1.f + vexp(-g)); }
}  // namespace

LLMD_CLONES
void swiglu_pairs(const float* pairs, float* out, int n) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    vf g, u;
    for (int l = 0; l < kLanes; ++l) {
      g[l] = pairs[2 * (i + l)];
      u[l] = pairs[2 * (i + l) + 1];
    }
    store(out + i, swiglu(g, u));
  }
  if (i < n) {  // the tail through the same vector arithmetic, zero-padded
    vf g{}, u{};
    for (int l = 0; l < n - i; ++l) {
      g[l] = pairs[2 * (i + l)];
      u[l] = pairs[2 * (i + l) + 1];
    }
    const vf y = swiglu(g, u);
    for (int l = 0; l < n - i; ++l) out[i + l] = y[l];
  }
}

}  // namespace llmd
