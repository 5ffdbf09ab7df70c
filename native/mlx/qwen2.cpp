// Qwen2 / Qwen2.5: a llama-family decoder whose q/k/v projections carry biases. llama.cpp's
// converter does not permute Qwen's Q/K rows, so GGUF files rotate halves (NEOX) like the
// Hugging Face layout.
#include "architectures.h"
#include "llama.h"

namespace llmd {

namespace {
LlamaVariant qwen2() {
  return {.arch = "qwen2", .requires_qkv_bias = true, .qk_norm = false, .gguf_interleaved_rope = false};
}
}  // namespace

std::unique_ptr<Model> load_qwen2_gguf(const GgufFile& file, const LoadOptions& options) {
  return load_llama_family_gguf(file, options, qwen2());
}

std::unique_ptr<Model> load_qwen2_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options) {
  return load_llama_family_safetensors(dir, hf, options, qwen2());
}

}  // namespace llmd
