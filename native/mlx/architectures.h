// Loaders of every architecture the engine runs, one pair per architecture file; the registry
// (model_registry.cpp) maps checkpoint architecture names onto them.
#pragma once

#include <memory>
#include <string>

#include "../core/gguf_file.h"
#include "../core/metadata.h"
#include "../core/model.h"

namespace llmd {

std::unique_ptr<Model> load_llama_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_llama_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);

std::unique_ptr<Model> load_qwen2_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen2_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);

std::unique_ptr<Model> load_qwen3_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen3_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);

std::unique_ptr<Model> load_gemma3_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_gemma3_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);

std::unique_ptr<Model> load_qwen3_5_moe_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen3_5_moe_safetensors(const std::string& dir, const Metadata& hf,
                                                    const LoadOptions& options);
// Dense Qwen3.5 (the same hybrid layers, a SwiGLU MLP per layer): GGUF `qwen35`, configs
// `qwen3_5_text` / `qwen3_5`.
std::unique_ptr<Model> load_qwen3_5_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen3_5_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);

std::unique_ptr<Model> load_gemma4_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_gemma4_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);

// Encoders (bert.cpp): BERT and XLM-RoBERTa (GGUF `bert` holds both), nomic-bert.
std::unique_ptr<Model> load_bert_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_nomic_bert_gguf(const GgufFile& file, const LoadOptions& options);
std::unique_ptr<Model> load_bert_safetensors(const std::string& dir, const Metadata& hf, const LoadOptions& options);
std::unique_ptr<Model> load_xlm_roberta_safetensors(const std::string& dir, const Metadata& hf,
                                                    const LoadOptions& options);
std::unique_ptr<Model> load_nomic_bert_safetensors(const std::string& dir, const Metadata& hf,
                                                   const LoadOptions& options);

}  // namespace llmd
