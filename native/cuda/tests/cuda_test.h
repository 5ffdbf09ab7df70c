// A minimal registry for the GPU test and benchmark binary (llmd_cuda_tests): each test file
// registers its cases with LLMD_CUDA_TEST / LLMD_CUDA_BENCH, and main() runs them, printing one
// line per case and exiting non-zero if any failed. Why not a test framework: the binary is
// built here and run on a lent GPU machine that cannot install anything, in one short call.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace llmd::cuda::testing {

struct Case {
  std::string name;
  std::function<void()> fn;
  bool bench;
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

struct Registrar {
  Registrar(const char* name, std::function<void()> fn, bool bench) { registry().push_back({name, std::move(fn), bench}); }
};

// ||out - ref|| / ||ref||, the error measure every kernel test reports.
inline double relative_error(const float* out, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = double(out[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// One printed line a benchmark reports (the device script collects them into bench/README.md).
inline void report(const std::string& what, double value, const std::string& unit) {
  std::printf("  %-64s %12.2f %s\n", what.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

inline std::mt19937& rng() {
  static std::mt19937 gen(1234);
  return gen;
}

}  // namespace llmd::cuda::testing

#define LLMD_CUDA_CONCAT_(a, b) a##b
#define LLMD_CUDA_CONCAT(a, b) LLMD_CUDA_CONCAT_(a, b)
#define LLMD_CUDA_TEST(name)                                                                           \
  static void name();                                                                                  \
  static ::llmd::cuda::testing::Registrar LLMD_CUDA_CONCAT(registrar_, name)(#name, name, false);       \
  static void name()
#define LLMD_CUDA_BENCH(name)                                                                          \
  static void name();                                                                                  \
  static ::llmd::cuda::testing::Registrar LLMD_CUDA_CONCAT(registrar_, name)(#name, name, true);        \
  static void name()

// Fails the current case with the expression, the file:line and a message.
#define LLMD_EXPECT(cond, msg)                                                                        \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::ostringstream llmd_os_;                                                                     \
      llmd_os_ << __FILE__ << ":" << __LINE__ << ": " << #cond << ": " << msg;                          \
      throw std::runtime_error(llmd_os_.str());                                                        \
    }                                                                                                  \
  } while (0)
