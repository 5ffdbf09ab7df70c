// Runs every registered GPU test (and with --bench every benchmark) whose name contains the
// filter argument (or, as "=NAME", equals it); exits 1 if any failed. --list prints the names
// without touching the GPU, so a session script can run each case in its own process (a kernel
// fault leaves a CUDA context unusable for every later case). See cuda_test.h.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cuda_test.h"

int main(int argc, char** argv) {
  bool bench = false, list = false;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bench") == 0) bench = true;
    else if (std::strcmp(argv[i], "--list") == 0) list = true;
    else filter = argv[i];
  }
  auto selected = [&](const llmd::cuda::testing::Case& c) {
    if (c.bench != bench) return false;
    if (filter.empty()) return true;
    if (filter[0] == '=') return c.name == filter.substr(1);
    return c.name.find(filter) != std::string::npos;
  };
  if (list) {
    for (const auto& c : llmd::cuda::testing::registry()) {
      if (selected(c)) std::printf("%s\n", c.name.c_str());
    }
    return 0;
  }
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("no CUDA device: nothing run\n");
    return 77;  // "skipped", as automake and ctest read it
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, %.1f GiB, L2 %.0f MiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0, prop.l2CacheSize / 1048576.0);
  int failed = 0, ran = 0;
  for (const auto& c : llmd::cuda::testing::registry()) {
    if (!selected(c)) continue;
    ++ran;
    std::printf("%s %s\n", bench ? "BENCH" : "TEST ", c.name.c_str());
    std::fflush(stdout);
    try {
      c.fn();
      const cudaError_t err = cudaDeviceSynchronize();
      if (err != cudaSuccess) throw std::runtime_error(std::string("after the case: ") + cudaGetErrorString(err));
      std::printf("  ok %s\n", c.name.c_str());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("  FAILED %s: %s\n", c.name.c_str(), e.what());
      cudaGetLastError();  // clear a sticky launch error where possible, so later cases still run
    }
    std::fflush(stdout);
  }
  std::printf("%d of %d %s passed\n", ran - failed, ran, bench ? "benchmarks" : "tests");
  return failed == 0 ? 0 : 1;
}
