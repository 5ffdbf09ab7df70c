// Standalone check of llmd's quantized CPU kernels, free of MLX and Python, so that a
// cross-compiled build can run under an emulator (tests/native/test_arm64_cross.py runs it
// under qemu-aarch64 and natively). Links only the kernel sources:
//   mlx/kernels/dispatch.cpp mlx/kernels/qgemm_*.cpp core/thread_pool.cpp core/tensor_types.cpp
//
// Usage: kernel_selftest CASES OUT
// CASES (little-endian), cases back to back until end of file:
//   uint32 type (GGUF ggml_type number), int32 n, int32 k, int32 rows,
//   uint8 weights[n * row_bytes(type, k)], float32 x[rows * k]
// OUT:
//   uint32 n_paths, then n_paths names of 16 bytes (NUL-padded), best path first; then for
//   each case and each path: float32 batched[rows * n] (all rows in one call), then
//   float32 alone[rows * n] (each row in a call of its own). NaN where a path has no kernel
//   for the type. stdout names the runnable paths and the active one (LLMD_CPU_PATH applies).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <vector>

#include "mlx/kernels/qgemm.h"

using namespace llmd;
using namespace llmd::kernels;

namespace {

// out[r * n + j] for x rows [0, rows), each call covering `rows_per_call` rows.
void run(const KernelTable& t, TensorType type, GemmFn gemm, const uint8_t* w, size_t rb, const float* x, int n,
         int k, int rows, int rows_per_call, float* out) {
  const int nb = k / kBlock;
  std::vector<ActBlock> act(static_cast<size_t>(rows) * nb);
  for (int r = 0; r < rows; ++r) t.quantizer_for(type)(x + static_cast<size_t>(r) * k, &act[r * nb], k);
  for (int r = 0; r < rows; r += rows_per_call) {
    const int count = std::min(rows_per_call, rows - r);
    gemm(w, rb, &act[r * nb], k, count, 0, n, out + static_cast<size_t>(r) * n, n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CASES OUT\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto tables = runnable_tables();
  std::printf("active: %s\npaths:", active_table().isa);
  for (const KernelTable* t : tables) std::printf(" %s", t->isa);
  std::printf("\n");

  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 1;
  const uint32_t n_paths = static_cast<uint32_t>(tables.size());
  std::fwrite(&n_paths, 4, 1, out);
  for (const KernelTable* t : tables) {
    char name[16] = {};
    std::strncpy(name, t->isa, sizeof(name) - 1);
    std::fwrite(name, 1, sizeof(name), out);
  }

  size_t pos = 0;
  int cases = 0;
  while (pos < data.size()) {
    int32_t hdr[4];
    if (data.size() - pos < sizeof(hdr)) return std::fprintf(stderr, "truncated header\n"), 1;
    std::memcpy(hdr, data.data() + pos, sizeof(hdr));
    pos += sizeof(hdr);
    const auto type = static_cast<TensorType>(hdr[0]);
    const int n = hdr[1], k = hdr[2], rows = hdr[3];
    const size_t rb = row_bytes(type, k);
    const size_t x_bytes = static_cast<size_t>(rows) * k * sizeof(float);
    if (data.size() - pos < rb * n + x_bytes) return std::fprintf(stderr, "truncated case\n"), 1;
    const auto* w = reinterpret_cast<const uint8_t*>(data.data() + pos);
    std::vector<float> x(static_cast<size_t>(rows) * k);
    std::memcpy(x.data(), data.data() + pos + rb * n, x_bytes);
    pos += rb * n + x_bytes;

    std::vector<float> res(static_cast<size_t>(rows) * n);
    for (const KernelTable* t : tables) {
      const GemmFn gemm = t->gemm_for(type);
      for (const int per_call : {rows, 1}) {
        if (gemm) {
          run(*t, type, gemm, w, rb, x.data(), n, k, rows, per_call, res.data());
        } else {
          std::fill(res.begin(), res.end(), std::numeric_limits<float>::quiet_NaN());
        }
        std::fwrite(res.data(), sizeof(float), res.size(), out);
      }
    }
    ++cases;
  }
  std::fclose(out);
  std::printf("cases: %d\n", cases);
  return 0;
}
