// Llama-family decoder (SmolLM2, Llama 2/3.x, and the Qwen2/Qwen3 files built on it): GQA
// attention, RMSNorm, SwiGLU MLP, RoPE with theta and scaling from the checkpoint, tied or
// untied embeddings. What a family member adds is named in a LlamaVariant.
#pragma once

#include <memory>
#include <string>

#include "../core/gguf_file.h"
#include "../core/metadata.h"
#include "../core/model.h"

namespace llmd {

struct LlamaVariant {
  std::string arch = "llama";  // GGUF `general.architecture` / config.json `model_type`
  // q/k/v projections carry biases (Qwen2). Without it, biases are used when present.
  bool requires_qkv_bias = false;
  // Per-head RMSNorm of q and k before RoPE (Qwen3: q_norm / k_norm).
  bool qk_norm = false;
  // llama.cpp's converter permutes llama's Q/K rows so GGUF llama models rotate interleaved
  // pairs (LLAMA_ROPE_TYPE_NORM); it leaves Qwen's alone, which rotate halves (NEOX).
  bool gguf_interleaved_rope = true;
};

std::unique_ptr<Model> load_llama_family_gguf(const GgufFile& file, const LoadOptions& options,
                                              const LlamaVariant& variant);
std::unique_ptr<Model> load_llama_family_safetensors(const std::string& dir, const Metadata& hf_config,
                                                     const LoadOptions& options, const LlamaVariant& variant);

}  // namespace llmd
