// Gemma 4's vision encoder (gemma4_vision.cpp): images of any size (the processor keeps each
// image's aspect ratio), as flattened patches on a grid, to the rows the text decoder reads at
// its `<|image|>` soft tokens.
#pragma once

#include <memory>
#include <string>

#include "siglip.h"

namespace llmd {

// The vision half (`model.vision_tower.*` and `model.embed_vision.*`) of a Hugging Face
// Gemma4ForConditionalGeneration directory; `config` is its whole config.json flattened.
std::unique_ptr<VisionTower> load_gemma4_vision(const std::string& dir, const Metadata& config,
                                                const LoadOptions& options);

}  // namespace llmd
