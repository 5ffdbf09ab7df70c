// Architecture registry: maps a checkpoint's architecture name to its loader. Adding an
// architecture is one file plus one line here.
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>

#include "../core/gguf_file.h"
#include "../core/model.h"
#include "kernels/qgemm.h"
#include "architectures.h"
#include "linear.h"
#ifdef LLMD_WITH_CUDA
#include "../cuda/cuda_model.h"
#endif

#include <mlx/mlx.h>

namespace llmd {

namespace {
using GgufLoader = std::function<std::unique_ptr<Model>(const GgufFile&, const LoadOptions&)>;
using HfLoader = std::function<std::unique_ptr<Model>(const std::string&, const Metadata&, const LoadOptions&)>;

const std::map<std::string, GgufLoader>& gguf_loaders() {
  static const std::map<std::string, GgufLoader> loaders{
      {"llama", load_llama_gguf},
      {"qwen2", load_qwen2_gguf},
      {"qwen3", load_qwen3_gguf},
      {"gemma3", load_gemma3_gguf},
      {"qwen35moe", load_qwen3_5_moe_gguf},
      {"qwen35", load_qwen3_5_gguf},
      {"gemma4", load_gemma4_gguf},  // refused with a clear message
      {"bert", load_bert_gguf},
      {"nomic-bert", load_nomic_bert_gguf},
  };
  return loaders;
}

const std::map<std::string, HfLoader>& hf_loaders() {
  static const std::map<std::string, HfLoader> loaders{
      {"llama", load_llama_safetensors},
      {"qwen2", load_qwen2_safetensors},
      {"qwen3", load_qwen3_safetensors},
      {"gemma3_text", load_gemma3_safetensors},
      {"qwen3_5_moe_text", load_qwen3_5_moe_safetensors},
      {"qwen3_5_moe", load_qwen3_5_moe_safetensors},
      {"qwen3_5_text", load_qwen3_5_safetensors},
      {"qwen3_5", load_qwen3_5_safetensors},
      {"gemma4_text", load_gemma4_safetensors},
      {"bert", load_bert_safetensors},
      {"xlm-roberta", load_xlm_roberta_safetensors},
      {"nomic_bert", load_nomic_bert_safetensors},
  };
  return loaders;
}

std::string known(const auto& loaders) {
  std::string s;
  for (const auto& [name, _] : loaders) s += (s.empty() ? "" : ", ") + name;
  return s;
}

namespace mx = mlx::core;

// Resolves "auto", checks the choice is runnable, and makes MLX's default device match it.
LoadOptions resolve_backend(LoadOptions options) {
  if (options.backend == "cuda") {
    // llmd's own CUDA kernels (native/cuda): only in a build made with them, on a CUDA machine.
#ifdef LLMD_WITH_CUDA
    if (!cuda::cuda_available()) throw std::runtime_error("backend 'cuda' requested but no CUDA device is present");
    mx::set_default_device(mx::Device::cpu);
    return options;
#else
    throw std::runtime_error(
        "backend 'cuda' needs llmd built with its CUDA kernels (CMAKE_ARGS=-DLLMD_CUDA=ON pip install '.[cuda]' on "
        "an NVIDIA machine)");
#endif
  }
  const bool has_gpu = mx::is_available(mx::Device::gpu);
  if (options.backend == "auto") options.backend = has_gpu ? "gpu" : "cpu";
  if (options.backend == "gpu" && !has_gpu) {
    throw std::runtime_error("backend 'gpu' requested but this MLX build has no GPU (install llmd[cuda] on an NVIDIA box)");
  }
  if (options.backend != "cpu" && options.backend != "gpu" && options.backend != "mlx-cpu") {
    throw std::runtime_error("unknown backend '" + options.backend + "' (expected auto, cpu, gpu, mlx-cpu or cuda)");
  }
  mx::set_default_device(options.backend == "gpu" ? mx::Device::gpu : mx::Device::cpu);
  if (options.on_device()) {
    // MLX keeps freed buffers for reuse, by default up to 95% of the device's memory; a daemon
    // must not hold memory it does not use (another process on the GPU failed to allocate
    // while an llmd engine ran on an H100). The KV store and weights are live arrays, so only
    // transient step buffers are cached, and 1 GiB covers them.
    const char* env = std::getenv("LLMD_MLX_CACHE_BYTES");
    mx::set_cache_limit(env ? std::strtoull(env, nullptr, 10) : (size_t{1} << 30));
  }
  return options;
}

void describe_backend(ModelInfo& info, const std::string& backend) {
  if (backend == "cuda") return;  // the cuda model described its device itself
  info.backend = backend;
  if (backend != "gpu") {
    info.device_name = backend == "cpu" ? std::string("cpu:") + kernels::active_table().isa : "cpu:mlx";
    return;
  }
  const auto& dev = mx::device_info(mx::Device::gpu);
  if (auto it = dev.find("device_name"); it != dev.end()) {
    if (auto* s = std::get_if<std::string>(&it->second)) info.device_name = *s;
  }
  for (const char* key : {"total_memory", "memory_size"}) {
    if (auto it = dev.find(key); it != dev.end()) {
      if (auto* n = std::get_if<size_t>(&it->second)) info.device_memory_bytes = *n;
    }
  }
}

std::unique_ptr<Model> load_model_on(const std::string& path, const LoadOptions& options,
                                     const Metadata& hf_config) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    const std::string type = hf_config.get_string("model_type").value_or("");
    auto it = hf_loaders().find(type);
    if (it == hf_loaders().end()) {
      throw std::runtime_error("architecture '" + type + "' is not supported (supported: " + known(hf_loaders()) + ")");
    }
    return it->second(path, hf_config, options);
  }
  if (options.backend == "cuda" && fs::is_directory(path)) {
    throw std::runtime_error("the cuda backend loads GGUF files so far; run this checkpoint with --backend gpu or cpu");
  }
  GgufFile file(path);
  const std::string arch = file.metadata().get_string("general.architecture").value_or("");
  if (options.backend == "cuda" && arch != "llama" && arch != "qwen2" && arch != "qwen3" && !options.validate_only) {
    throw std::runtime_error("the cuda backend runs llama, qwen2 and qwen3 GGUF models so far, not '" + arch +
                             "'; use --backend gpu or cpu");
  }
  auto it = gguf_loaders().find(arch);
  if (it == gguf_loaders().end()) {
    throw std::runtime_error("architecture '" + arch + "' is not supported (supported: " + known(gguf_loaders()) + ")");
  }
  return it->second(file, options);
}

}  // namespace

// In a build with llmd's CUDA kernels, on a machine with a CUDA device, "auto" runs the
// architectures the cuda backend has (GGUF llama, qwen2, qwen3) there: on an H200 it decoded an 8B
// model 1.3x faster than llama.cpp's CUDA build and prefilled ~2x faster, where MLX's CUDA backend
// ran at 0.28x and 0.12-0.64x (bench/README.md). Everything else keeps MLX's GPU or the CPU.
static bool auto_picks_cuda(const std::string& path, const LoadOptions& requested) {
#ifdef LLMD_WITH_CUDA
  namespace fs = std::filesystem;
  if (requested.backend != "auto" || fs::is_directory(path) || !cuda::cuda_available()) return false;
  const std::string arch = GgufFile(path).metadata().get_string("general.architecture").value_or("");
  return arch == "llama" || arch == "qwen2" || arch == "qwen3";
#else
  (void)path;
  (void)requested;
  return false;
#endif
}

std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& requested,
                                  const Metadata& hf_config) {
  LoadOptions chosen = requested;
  if (auto_picks_cuda(path, requested)) chosen.backend = "cuda";
  const LoadOptions options = resolve_backend(chosen);
  std::optional<SkipWeightBytes> skip;
  if (options.validate_only) skip.emplace();
  auto model = load_model_on(path, options, hf_config);
  describe_backend(model->mutable_info(), options.backend);
  return model;
}

}  // namespace llmd
