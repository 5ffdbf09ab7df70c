// Runs every registered GPU test (and with --bench every benchmark) whose name contains the
// filter argument; exits 1 if any failed. See cuda_test.h.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cuda_test.h"

int main(int argc, char** argv) {
  bool bench = false;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bench") == 0) bench = true;
    else filter = argv[i];
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
    if (c.bench != bench) continue;
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
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
