// Benchmarks of matmul.h: the GEMV at batch 1 and 32 on Llama-3-8B's shapes for the fast formats, against a
// device-to-device copy's bandwidth measured first (the ceiling), and the prefill path (dequantize + cuBLAS) at 512
// and 4096 rows. GEMV timings: CUDA graphs of back-to-back launches rotating over enough copies of the matrix that
// the set exceeds L2 (60 MB on an H200), replayed after a warm-up; the median replay over the launches. GB/s
// counts the bytes a launch must move: the weights, the q8 activations, and y.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda/matmul.h"
#include "cuda/matmul_internal.h"
#include "cuda_test.h"
#include "matmul_test_util.h"

namespace llmd::cuda::testing {
namespace {

struct Events {
  cudaEvent_t a, b;
  Events() {
    LLMD_CUDA_CHECK(cudaEventCreate(&a));
    LLMD_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

struct Stream {
  cudaStream_t s;
  Stream() { LLMD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Median milliseconds of `reps` runs of fn (each run enqueued on `stream` between two events).
template <class F>
double median_ms(cudaStream_t stream, int reps, F&& fn) {
  Events ev;
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    LLMD_CUDA_CHECK(cudaEventRecord(ev.a, stream));
    fn();
    LLMD_CUDA_CHECK(cudaEventRecord(ev.b, stream));
    LLMD_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float ms = 0;
    LLMD_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double copy_gbps() {
  static double gbps = 0;
  if (gbps > 0) return gbps;
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer a(bytes), b(bytes);
  LLMD_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  Stream st;
  LLMD_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, st.s));
  const double ms = median_ms(st.s, 9, [&] {
    LLMD_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, st.s));
  });
  gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;  // read + write
  return gbps;
}

LLMD_CUDA_BENCH(matmul_bench_copy) { report("device-to-device copy (1 GiB, read + write)", copy_gbps(), "GB/s"); }

DeviceMatrix device_copy(const DeviceMatrix& w) {
  DeviceMatrix c;
  c.format = w.format;
  c.rows = w.rows;
  c.cols = w.cols;
  c.group_size = w.group_size;
  c.data = DeviceBuffer(w.data.bytes());
  LLMD_CUDA_CHECK(cudaMemcpy(c.data.get(), w.data.get(), w.data.bytes(), cudaMemcpyDeviceToDevice));
  if (w.aux.bytes() > 0) {
    c.aux = DeviceBuffer(w.aux.bytes());
    LLMD_CUDA_CHECK(cudaMemcpy(c.aux.get(), w.aux.get(), w.aux.bytes(), cudaMemcpyDeviceToDevice));
  }
  return c;
}

struct Shape {
  const char* name;
  int rows, cols;
  Epilogue epi;
};
constexpr Shape kShapes[] = {{"attn_qkv", 6144, 4096, Epilogue::Store},
                             {"attn_output", 4096, 4096, Epilogue::Add},
                             {"ffn_gate_up", 28672, 4096, Epilogue::SwiGLU},
                             {"ffn_down", 4096, 14336, Epilogue::Add},
                             {"output", 128256, 4096, Epilogue::Store}};

// Sets (value != nullptr) an environment variable for a scope, restoring what it was.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value == nullptr) return;
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
    set_ = true;
  }
  ~ScopedEnv() {
    if (!set_) return;
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool set_ = false, had_ = false;
  std::string old_;
};

void bench_gemv_format(const char* fmt_label, TensorType type, int mlx_bits) {
  const double ceiling = copy_gbps();
  Stream st;
  MatmulContext ctx(kMaxGemvBatch, 0, st.s);
  Activations acts(kMaxGemvBatch, 14336);
  DeviceBuffer y(size_t(kMaxGemvBatch) * 128256 * sizeof(float));
  LLMD_CUDA_CHECK(cudaMemset(y.get(), 0, y.bytes()));
  for (const Shape& sh : kShapes) {
    const HostMatrix h = mlx_bits ? random_mlx(mlx_bits, 64, sh.rows, sh.cols, 77)
                                  : random_gguf(type, sh.rows, sh.cols, 77);
    std::vector<DeviceMatrix> copies;
    copies.push_back(h.upload());
    const size_t wbytes = copies[0].bytes();
    const int n_copies = int(std::min<size_t>(8, std::max<size_t>(1, (size_t(240) << 20) / wbytes + 1)));
    while (int(copies.size()) < n_copies) copies.push_back(device_copy(copies[0]));
    {
      std::vector<float> x(size_t(kMaxGemvBatch) * sh.cols);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& v : x) v = nd(rng());
      DeviceBuffer dx(x.size() * 4);
      dx.upload(x.data(), x.size() * 4);
      quantize_activations(dx.as<float>(), sh.cols, kMaxGemvBatch, sh.cols, acts, st.s);
      LLMD_CUDA_CHECK(cudaStreamSynchronize(st.s));
    }
    const int out_rows = sh.epi == Epilogue::SwiGLU ? sh.rows / 2 : sh.rows;
    // b1 (GEMV), b16 and b32 (the tensor-core kernel for quantized formats), and b32 again with LLMD_CUDA_MMA=0
    // (the GEMV at 32 rows), so one run compares the two paths.
    struct Run {
      int batch;
      bool gemv;
    };
    for (const Run run : {Run{1, false}, Run{16, false}, Run{32, false}, Run{32, true}}) {
      if (run.gemv && !detail::use_mma(copies[0], run.batch)) continue;  // already measured (F16, or MMA off)
      const ScopedEnv mma_env("LLMD_CUDA_MMA", run.gemv ? "0" : nullptr);
      const int batch = run.batch;
      acts.rows = batch;
      const int launches = std::max(20, n_copies) / n_copies * n_copies;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      LLMD_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < launches; ++i)
        matmul(ctx, copies[i % n_copies], acts, y.as<float>(), out_rows, sh.epi, st.s);
      LLMD_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
      LLMD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      LLMD_CUDA_CHECK(cudaGraphLaunch(exec, st.s));  // warm-up
      const double ms = median_ms(st.s, 7, [&] { LLMD_CUDA_CHECK(cudaGraphLaunch(exec, st.s)); }) / launches;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      const double act_bytes = double(batch) * (sh.cols + sh.cols / 32 * 8);
      const double y_bytes = double(batch) * out_rows * 4 * (sh.epi == Epilogue::Add ? 2 : 1);
      const double gbps = (wbytes + act_bytes + y_bytes) / (ms * 1e-3) / 1e9;
      char label[224];
      std::snprintf(label, sizeof label, "gemv %-10s %-11s %6dx%-5d b%-2d %8.1f us %5.1f%% of copy (%s)", fmt_label,
                    sh.name, sh.rows, sh.cols, batch, ms * 1e3, 100.0 * gbps / ceiling, matmul_path(copies[0], batch));
      report(label, gbps, "GB/s");
    }
  }
}

LLMD_CUDA_BENCH(matmul_bench_gemv_q4_0) { bench_gemv_format("q4_0", TensorType::Q4_0, 0); }
LLMD_CUDA_BENCH(matmul_bench_gemv_q4_k) { bench_gemv_format("q4_k", TensorType::Q4_K, 0); }
LLMD_CUDA_BENCH(matmul_bench_gemv_q8_0) { bench_gemv_format("q8_0", TensorType::Q8_0, 0); }
LLMD_CUDA_BENCH(matmul_bench_gemv_q5_k) { bench_gemv_format("q5_k", TensorType::Q5_K, 0); }
LLMD_CUDA_BENCH(matmul_bench_gemv_q6_k) { bench_gemv_format("q6_k", TensorType::Q6_K, 0); }
LLMD_CUDA_BENCH(matmul_bench_gemv_mlx4) { bench_gemv_format("mlx4_g64", TensorType::F16, 4); }

// Prefill: dequantize + cuBLAS for Q4_0 and Q4_K, and F16 weights (cuBLAS alone) for comparison; the
// dequantization alone is timed too, so its share of the Q4_0 time shows.
LLMD_CUDA_BENCH(matmul_bench_prefill) {
  Stream st;
  const int max_rows = 4096, cols = 4096;
  MatmulContext ctx(max_rows, size_t(28672) * cols, st.s);
  Activations acts(max_rows, cols);
  {
    std::vector<float> x(size_t(max_rows) * cols);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng());
    DeviceBuffer dx(x.size() * 4);
    dx.upload(x.data(), x.size() * 4);
    quantize_activations(dx.as<float>(), cols, max_rows, cols, acts, st.s);
    LLMD_CUDA_CHECK(cudaStreamSynchronize(st.s));  // before dx is freed
  }
  DeviceBuffer y(size_t(max_rows) * 28672 * sizeof(float));
  DeviceBuffer scratch(size_t(28672) * cols * 2);
  for (int rows : {4096, 28672}) {
    for (TensorType t : {TensorType::Q4_0, TensorType::Q4_K, TensorType::F16}) {
      const DeviceMatrix w = random_gguf(t, rows, cols, 99).upload();
      if (t != TensorType::F16) {
        detail::launch_dequantize_f16(w, scratch.as<__half>(), st.s);
        const double ms = median_ms(st.s, 9, [&] { detail::launch_dequantize_f16(w, scratch.as<__half>(), st.s); });
        const double gbps = (w.bytes() + double(rows) * cols * 2) / (ms * 1e-3) / 1e9;
        char label[160];
        std::snprintf(label, sizeof label, "dequantize %s %dx%d -> f16: %.1f us", type_name(t).c_str(), rows, cols,
                      ms * 1e3);
        report(label, gbps, "GB/s");
      }
      for (int n : {512, 4096}) {
        acts.rows = n;
        matmul(ctx, w, acts, y.as<float>(), rows, Epilogue::Store, st.s);  // warm-up (cuBLAS heuristics, scratch)
        const double ms =
            median_ms(st.s, 9, [&] { matmul(ctx, w, acts, y.as<float>(), rows, Epilogue::Store, st.s); });
        char label[160];
        std::snprintf(label, sizeof label, "prefill %s %dx%d, %d rows (%s): %.1f us", type_name(t).c_str(), rows,
                      cols, n, matmul_path(w, n), ms * 1e3);
        report(label, 2.0 * n * rows * cols / (ms * 1e-3) / 1e12, "TFLOP/s");
      }
    }
  }
}

}  // namespace
}  // namespace llmd::cuda::testing
