// Qwen3.5's vision encoder (qwen_vision.cpp): images of any size, as flattened patches on a
// grid, to the rows the text decoder reads at its `<|image_pad|>` tokens.
#pragma once

#include <memory>
#include <string>

#include "../core/gguf_file.h"
#include "siglip.h"

namespace llmd {

// The vision half (`model.visual.*`) of a Hugging Face Qwen3_5ForConditionalGeneration or
// Qwen3_5MoeForConditionalGeneration directory; `config` is its whole config.json flattened.
std::unique_ptr<VisionTower> load_qwen_vision(const std::string& dir, const Metadata& config,
                                              const LoadOptions& options);

// llama.cpp's mmproj GGUF of the same tower (clip.projector_type "qwen3vl_merger"); `path`
// names it in errors.
std::unique_ptr<VisionTower> load_qwen_mmproj(const GgufFile& file, const std::string& path,
                                              const LoadOptions& options);

}  // namespace llmd
