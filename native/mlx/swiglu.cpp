#include "swiglu.h"

#include <algorithm>

#include "simd.h"

namespace llmd {

namespace {
using namespace simd;

// silu(g) * u = g * u / (1 + exp(-g)) for one vector of pairs.
[[gnu::always_inline]] inline vf swiglu(vf g, vf u) { return g * u / (1.f + vexp(-g)); }
}  // namespace

LLMD_CLONES
void swiglu_pairs(const float* pairs, float* out, int n) {
  for (int i = 0; i < n; i += kLanes) {
    const int m = std::min(kLanes, n - i);  // the tail goes through the same arithmetic, zero-padded
    vf g{}, u{};
    for (int l = 0; l < m; ++l) {
      g[l] = pairs[2 * (i + l)];
      u[l] = pairs[2 * (i + l) + 1];
    }
    const vf y = swiglu(g, u);
    if (m == kLanes) {
      store(out + i, y);
    } else {
      for (int l = 0; l < m; ++l) out[i + l] = y[l];
    }
  }
}

}  // namespace llmd
