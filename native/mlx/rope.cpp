#include "rope.h"

#include <cmath>

namespace llmd {

std::vector<float> rope_inv_freq(int dims, double theta, const std::vector<float>& factors) {
  std::vector<float> inv(dims / 2);
  for (int i = 0; i < dims / 2; ++i) {
    double f = std::pow(theta, -2.0 * i / dims);
    if (!factors.empty()) f /= factors[i];
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

std::vector<float> llama3_rope_factors(int dims, double theta, double factor, double low_freq_factor,
                                       double high_freq_factor, int original_context) {
  std::vector<float> factors(dims / 2);
  const double low_wavelen = original_context / low_freq_factor;
  const double high_wavelen = original_context / high_freq_factor;
  for (int i = 0; i < dims / 2; ++i) {
    const double freq = std::pow(theta, -2.0 * i / dims);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      factors[i] = 1.f;
    } else if (wavelen > low_wavelen) {
      factors[i] = static_cast<float>(factor);
    } else {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      factors[i] = static_cast<float>(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return factors;
}

void Rope::tables(int pos, float* cos_out, float* sin_out) const {
  for (int i = 0; i < dims / 2; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(angle));
    sin_out[i] = static_cast<float>(std::sin(angle));
  }
}

void Rope::rotate(float* x, const float* cos_t, const float* sin_t) const {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = x[a];
    const float x1 = x[b];
    x[a] = x0 * cos_t[i] - x1 * sin_t[i];
    x[b] = x0 * sin_t[i] + x1 * cos_t[i];
  }
}

}  // namespace llmd
