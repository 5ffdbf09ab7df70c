// The cuda backend's model end to end, on GGUF files named by environment variables (the GPU
// session script writes them: bench/gpu/cuda_session.sh):
//   LLMD_CUDA_TEST_MODELS  colon-separated small GGUFs: the cuda model's logits are checked
//                          against llmd's CPU backend (itself verified token by token against
//                          llama.cpp) over batched prefill, mixed and decode steps.
//   LLMD_BENCH_GGUF        colon-separated large GGUFs for the model benchmarks: tg128, pp512,
//                          pp4096, aggregate decode at batch 8 and 32, each printed as a RESULT
//                          line the session script compares with llama.cpp's figures.
#include <cuda_runtime.h>
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#else  // toolkits without NVTX (the PyPI headers CI compiles against): the profile ranges are no-ops
inline void nvtxRangePushA(const char*) {}
inline void nvtxRangePop() {}
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../../core/engine.h"
#include "../../core/kv_cache.h"
#include "../../core/model.h"
#include "../../core/step.h"
#include "../cuda_model.h"
#include "cuda_test.h"

namespace llmd::cuda {
namespace {

std::vector<std::string> paths_from_env(const char* name) {
  std::vector<std::string> out;
  const char* v = std::getenv(name);
  if (v == nullptr) return out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ':')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::unique_ptr<Model> load(const std::string& path, const std::string& backend, int context = 4096) {
  LoadOptions options;
  options.backend = backend;
  options.context_length = context;
  return load_model(path, options, Metadata{});
}

// One sequence's KV in a pool, fed through Model::forward as the engine would.
struct Sequence {
  explicit Sequence(KvPool& pool) : kv(pool) {}
  SequenceKv kv;
  std::vector<int32_t> tokens;
};

StepSegment segment(Sequence& s, const std::vector<int32_t>& fed, bool logits = true) {
  StepSegment seg;
  seg.kv = &s.kv;
  seg.start_pos = s.kv.length();
  seg.tokens = fed;
  seg.want_logits = logits;
  if (!s.kv.reserve(seg.start_pos + static_cast<int>(fed.size()))) throw std::runtime_error("KV budget exhausted");
  return seg;
}

void advance(Step& step) {
  for (auto& seg : step.segments) seg.kv->set_length(seg.start_pos + static_cast<int>(seg.tokens.size()));
}

int argmax(const float* row, int n) { return static_cast<int>(std::max_element(row, row + n) - row); }

// Compares one step's logits rows: relative error of each row, and whether the cuda model's top
// token is, under the CPU's logits, within `tie` of the CPU's top (random-weight models have
// near-ties; the parity tests against llama.cpp use the same 0.5-logit tolerance).
void compare_logits(const std::vector<float>& cpu, const std::vector<float>& gpu, int vocab, const std::string& what,
                    double* worst) {
  LLMD_EXPECT(cpu.size() == gpu.size(), what << ": " << cpu.size() << " vs " << gpu.size() << " logits");
  const int rows = static_cast<int>(cpu.size()) / vocab;
  for (int r = 0; r < rows; ++r) {
    const float* c = cpu.data() + static_cast<size_t>(r) * vocab;
    const float* g = gpu.data() + static_cast<size_t>(r) * vocab;
    const double err = testing::relative_error(g, c, vocab);
    *worst = std::max(*worst, err);
    LLMD_EXPECT(err < 0.05, what << " row " << r << ": relative error " << err);
    const int top_cpu = argmax(c, vocab), top_gpu = argmax(g, vocab);
    LLMD_EXPECT(c[top_cpu] - c[top_gpu] < 0.5f, what << " row " << r << ": cuda picks " << top_gpu << " (cpu logit "
                                                     << c[top_gpu] << ") over cpu's " << top_cpu << " ("
                                                     << c[top_cpu] << ")");
  }
}

LLMD_CUDA_TEST(model_matches_cpu_backend_batched) {
  const auto models = paths_from_env("LLMD_CUDA_TEST_MODELS");
  LLMD_EXPECT(!models.empty(), "LLMD_CUDA_TEST_MODELS names no GGUF file");
  for (const std::string& path : models) {
    auto cpu = load(path, "cpu");
    auto gpu = load(path, "cuda");
    const int vocab = cpu->info().vocab_size;
    KvPool cpu_pool(cpu->kv_shape(), size_t{256} << 20);
    KvPool gpu_pool(gpu->kv_shape(), size_t{256} << 20);
    std::uniform_int_distribution<int> token(0, vocab - 1);
    // Twelve prompts (70 and 130 tokens cross block boundaries), prefilled in one step; then 24
    // decode steps of all twelve (12 rows: the tensor-core path of 9..32 rows; graph replays as
    // they grow past a block); in the middle, a 40-token prefill shares a step with the decode rows.
    const int nseq = 12;
    std::vector<std::unique_ptr<Sequence>> cs, gs;
    Step cstep, gstep;
    for (int len : {70, 5, 130, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
      std::vector<int32_t> prompt(len);
      for (auto& t : prompt) t = token(testing::rng());
      cs.push_back(std::make_unique<Sequence>(cpu_pool));
      gs.push_back(std::make_unique<Sequence>(gpu_pool));
      cstep.segments.push_back(segment(*cs.back(), prompt));
      gstep.segments.push_back(segment(*gs.back(), prompt));
    }
    double worst = 0;
    std::vector<float> cl, gl;
    cpu->forward(cstep, cpu_pool, cl);
    gpu->forward(gstep, gpu_pool, gl);
    compare_logits(cl, gl, vocab, path + " prefill", &worst);
    advance(cstep);
    advance(gstep);
    std::vector<int32_t> next(nseq);
    for (int s = 0; s < nseq; ++s) next[s] = argmax(cl.data() + static_cast<size_t>(s) * vocab, vocab);
    for (int i = 0; i < 24; ++i) {
      Step c, g;
      for (int s = 0; s < nseq; ++s) {
        c.segments.push_back(segment(*cs[s], {next[s]}));
        g.segments.push_back(segment(*gs[s], {next[s]}));
      }
      if (i == 10) {
        std::vector<int32_t> prompt(40);
        for (auto& t : prompt) t = token(testing::rng());
        cs.push_back(std::make_unique<Sequence>(cpu_pool));
        gs.push_back(std::make_unique<Sequence>(gpu_pool));
        c.segments.push_back(segment(*cs.back(), prompt));
        g.segments.push_back(segment(*gs.back(), prompt));
      }
      cpu->forward(c, cpu_pool, cl);
      gpu->forward(g, gpu_pool, gl);
      compare_logits(cl, gl, vocab, path + " step " + std::to_string(i), &worst);
      advance(c);
      advance(g);
      for (int s = 0; s < nseq; ++s) next[s] = argmax(cl.data() + static_cast<size_t>(s) * vocab, vocab);
    }
    std::printf("  %s: worst logits relative error %.4g; attention paths:", path.c_str(), worst);
    for (const auto& [name, n] : gpu->attention_paths()) std::printf(" %s=%llu", name.c_str(), (unsigned long long)n);
    std::printf("\n  matmul paths:");
    for (const auto& [name, p] : gpu->matmul_paths()) std::printf(" %s=%s;", name.c_str(), p.c_str());
    std::printf("\n");
  }
}

// The engine (scheduler, prefix cache, sampler) over the cuda model: requests complete, run
// batched, and a repeated prompt is served from the prefix cache through copied/shared blocks.
LLMD_CUDA_TEST(engine_runs_batched_with_prefix_cache_on_cuda) {
  const auto models = paths_from_env("LLMD_CUDA_TEST_MODELS");
  LLMD_EXPECT(!models.empty(), "LLMD_CUDA_TEST_MODELS names no GGUF file");
  auto gpu = load(models.front(), "cuda");
  const int vocab = gpu->info().vocab_size;
  EngineOptions options;
  options.max_sequences = 8;
  options.kv_budget_bytes = size_t{256} << 20;
  Engine engine(std::move(gpu), options);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<int32_t> shared(150);
  for (auto& t : shared) t = token(testing::rng());
  auto run = [&](int n, const std::string& tag) {
    for (int i = 0; i < n; ++i) {
      GenerateRequest r;
      r.id = tag + std::to_string(i);
      r.prompt = shared;
      r.prompt.push_back(token(testing::rng()));
      r.max_tokens = 16;
      engine.submit(r);
    }
    int done = 0, tokens = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (done < n && std::chrono::steady_clock::now() < deadline) {
      for (const EngineEvent& e : engine.poll(1000)) {
        if (e.kind == EngineEvent::Kind::Tokens) tokens += static_cast<int>(e.tokens.size());
        if (e.kind == EngineEvent::Kind::Error) throw std::runtime_error("engine error: " + e.message);
        if (e.kind == EngineEvent::Kind::Done) ++done;
      }
    }
    LLMD_EXPECT(done == n, tag << ": " << done << " of " << n << " requests finished");
    LLMD_EXPECT(tokens == 16 * n, tag << ": " << tokens << " tokens for " << n << " requests of 16");
  };
  run(6, "batch");
  run(1, "again");
  const EngineStats st = engine.stats();
  std::printf("  max rows sampled in a step %d, prefix cache hits %llu, cached tokens %llu\n",
              st.max_rows_sampled_in_a_step, (unsigned long long)st.prefix_cache_hits,
              (unsigned long long)st.prefix_cached_tokens);
  LLMD_EXPECT(st.max_rows_sampled_in_a_step >= 4, "decode was not batched: " << st.max_rows_sampled_in_a_step);
  LLMD_EXPECT(st.prefix_cache_hits >= 1, "the repeated prompt missed the prefix cache");
}

// --- benchmarks -----------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void result(const std::string& file, const std::string& test, double tok_s) {
  std::printf("RESULT file=%s test=%s tok_s=%.2f\n", file.c_str(), test.c_str(), tok_s);
  std::fflush(stdout);
}

// Decode `steps` tokens for `seqs` sequences after a `prompt`-token prefill each (prefilled in
// chunks of at most 512 rows, as the engine's default step budget does); returns generated
// tokens per second over the decode steps alone (llama-batched-bench's S_TG; with one sequence
// and prompt 1 what llama-bench's tg reports). As in those tools, nothing is sampled: each step's
// logits come back to the host and the next tokens are fixed ids, so the figure is the model's
// step, not the host sampler (the engine's own cost, measured elsewhere).
double decode_rate(Model& model, int seqs, int prompt, int steps) {
  KvPool pool(model.kv_shape(), size_t{12} << 30);
  std::vector<std::unique_ptr<Sequence>> s;
  std::vector<int32_t> next(seqs, 1);
  for (int i = 0; i < seqs; ++i) s.push_back(std::make_unique<Sequence>(pool));
  std::vector<float> logits;
  const int vocab = model.info().vocab_size;
  for (int i = 0; i < seqs;) {
    Step step;
    int rows = 0;
    for (; i < seqs && rows + prompt <= std::max(512, prompt); ++i, rows += prompt) {
      step.segments.push_back(segment(*s[i], std::vector<int32_t>(prompt, 7 + i)));
    }
    model.forward(step, pool, logits);
    advance(step);
  }
  std::chrono::steady_clock::time_point t0;
  for (int k = 0; k < steps + 2; ++k) {
    if (k == 2) t0 = std::chrono::steady_clock::now();  // two warm-up steps: graph capture
    Step step;
    for (int i = 0; i < seqs; ++i) step.segments.push_back(segment(*s[i], {next[i]}));
    model.forward(step, pool, logits);
    advance(step);
    for (int i = 0; i < seqs; ++i) next[i] = (next[i] * 31 + 17 + i) % vocab;
  }
  return seqs * steps / seconds_since(t0);
}

// Prefill of `tokens` tokens of one sequence in chunks of `chunk`; tokens per second.
double prefill_rate(Model& model, int tokens, int chunk) {
  KvPool pool(model.kv_shape(), size_t{12} << 30);
  Sequence s(pool);
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int done = 0; done < tokens; done += chunk) {
    Step step;
    step.segments.push_back(segment(s, std::vector<int32_t>(std::min(chunk, tokens - done), 11)));
    model.forward(step, pool, logits);
    advance(step);
  }
  return tokens / seconds_since(t0);
}

// Three decode steps of LLMD_PROFILE_SEQS sequences (default 1) of the first LLMD_BENCH_GGUF file,
// run eagerly (no graph) inside an NVTX range "decode", for a per-kernel profile under Nsight
// Compute (`ncu --nvtx --nvtx-include decode/ ...`: bench/gpu/cuda_session.sh).
LLMD_CUDA_BENCH(model_profile_step) {
  const auto files = paths_from_env("LLMD_BENCH_GGUF");
  if (files.empty()) {
    std::printf("  LLMD_BENCH_GGUF not set: skipped\n");
    return;
  }
  const int seqs = std::getenv("LLMD_PROFILE_SEQS") ? std::atoi(std::getenv("LLMD_PROFILE_SEQS")) : 1;
  setenv("LLMD_CUDA_GRAPHS", "0", 1);
  auto model = load(files.front(), "cuda", 8192);
  KvPool pool(model->kv_shape(), size_t{4} << 30);
  std::vector<std::unique_ptr<Sequence>> s;
  std::vector<float> logits;
  Step prefill;
  for (int i = 0; i < seqs; ++i) {
    s.push_back(std::make_unique<Sequence>(pool));
    prefill.segments.push_back(segment(*s.back(), std::vector<int32_t>(100, 5 + i)));
  }
  model->forward(prefill, pool, logits);
  advance(prefill);
  for (int k = 0; k < 4; ++k) {
    Step step;
    for (int i = 0; i < seqs; ++i) step.segments.push_back(segment(*s[i], {9 + k}));
    if (k == 1) nvtxRangePushA("decode");
    model->forward(step, pool, logits);
    advance(step);
  }
  nvtxRangePop();
  unsetenv("LLMD_CUDA_GRAPHS");
}

LLMD_CUDA_BENCH(model_step_rates) {
  const auto files = paths_from_env("LLMD_BENCH_GGUF");
  if (files.empty()) {
    std::printf("  LLMD_BENCH_GGUF not set: skipped\n");
    return;
  }
  const int reps = std::getenv("LLMD_BENCH_REPS") ? std::atoi(std::getenv("LLMD_BENCH_REPS")) : 3;
  for (const std::string& file : files) {
    const auto t_load = std::chrono::steady_clock::now();
    auto model = load(file, "cuda", 8192);
    std::printf("  %s loaded in %.1f s\n", file.c_str(), seconds_since(t_load));
    auto median = [&](auto fn) {
      std::vector<double> v;
      for (int r = 0; r < reps; ++r) v.push_back(fn());
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    prefill_rate(*model, 512, 512);  // warm-up: cuBLAS handles, first allocations
    result(file, "tg128", median([&] { return decode_rate(*model, 1, 1, 128); }));
    std::printf("  decode step graph: %d nodes at batch 1\n", decode_graph_nodes(*model, 1));
    setenv("LLMD_CUDA_GRAPHS", "0", 1);
    result(file, "tg128_nograph", median([&] { return decode_rate(*model, 1, 1, 128); }));
    unsetenv("LLMD_CUDA_GRAPHS");
    result(file, "pp512", median([&] { return prefill_rate(*model, 512, 512); }));
    result(file, "pp4096", median([&] { return prefill_rate(*model, 4096, 512); }));
    result(file, "pp4096_chunk2048", median([&] { return prefill_rate(*model, 4096, 2048); }));
    result(file, "batch8", median([&] { return decode_rate(*model, 8, 128, 128); }));
    result(file, "batch32", median([&] { return decode_rate(*model, 32, 128, 128); }));
    std::printf("  decode step graph: %d nodes at batch 32\n", decode_graph_nodes(*model, 32));
    // The same 32 rows through the GEMV instead of the tensor-core kernel (matmul_mma.cu).
    setenv("LLMD_CUDA_MMA", "0", 1);
    result(file, "batch32_gemv", median([&] { return decode_rate(*model, 32, 128, 128); }));
    unsetenv("LLMD_CUDA_MMA");
    // The same 32 rows through the prefill path (dequantize + cuBLAS) instead of the decode kernels.
    setenv("LLMD_CUDA_GEMV_ROWS", "8", 1);
    result(file, "batch32_gemm", median([&] { return decode_rate(*model, 32, 128, 128); }));
    unsetenv("LLMD_CUDA_GEMV_ROWS");
  }
}

}  // namespace
}  // namespace llmd::cuda
