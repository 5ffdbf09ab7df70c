// Qwen3 (dense): a llama-family decoder with per-head RMSNorm of q and k before RoPE
// (q_norm / k_norm), no q/k/v biases, and head_dim from the config (it need not be
// hidden_size / heads). GGUF files rotate halves (NEOX), as for Qwen2.
#include "architectures.h"
#include "llama.h"

namespace llmd {

namespace {
LlamaVariant qwen3() {
  return {.arch = "qwen3", .requires_qkv_bias = false, .qk_norm = true, .gguf_interleaved_rope = false};
}
}  // namespace

std::unique_ptr<Model> load_qwen3_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_llama_family_gguf(file, options, qwen3());
}

std::unique_ptr<Model> load_qwen3_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  return load_llama_family_safetensors(dir, hf, options, qwen3());
}

}  // namespace llmd
