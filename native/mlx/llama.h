// Llama-family decoder (SmolLM2, Llama 2/3.x): GQA attention, RMSNorm, SwiGLU MLP, RoPE with
// theta and scaling from the checkpoint, tied or untied embeddings.
#pragma once

#include <memory>
#include <string>

#include "../core/gguf_file.h"
#include "../core/metadata.h"
#include "../core/model.h"

namespace llmd {

std::unique_ptr<Model> load_llama_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_llama_safetensors(const std::string& dir, const Metadata& hf_config,
                                              const LoadOptions& options);

}  // namespace llmd
