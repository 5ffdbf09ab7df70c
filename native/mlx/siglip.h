// Vision towers: what turns a preprocessed image into the rows a multimodal decoder reads in
// place of its image placeholder tokens. One tower per architecture file (siglip.cpp: Gemma 3).
// A tower is separate from the decoder (Model): it runs whole images through a bidirectional
// encoder with no KV cache, and the engine only ever sees the embeddings it produces.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "../core/metadata.h"
#include "../core/model.h"

namespace llmd {

struct VisionInfo {
  std::string architecture;  // "gemma3"
  int image_size = 0;        // square images of image_size x image_size pixels
  int channels = 3;
  int tokens_per_image = 0;  // embedding rows per image
  int hidden_size = 0;       // width of each row: the text decoder's hidden size
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;
  virtual const VisionInfo& info() const = 0;
  // `n` images as float32 [n, channels, image_size, image_size] (the processor's normalized
  // pixels) -> float32 [n, tokens_per_image, hidden_size], in one batched pass.
  virtual std::vector<float> encode(const float* pixels, int n) const = 0;
};

// The vision half of a Hugging Face multimodal checkpoint directory; `config` is its whole
// config.json flattened ("vision_config.hidden_size", "mm_tokens_per_image", ...). When `dir`
// is a file, it is llama.cpp's mmproj GGUF (the vision half of a GGUF model; `config` unused).
// Throws naming what is missing or unsupported (a checkpoint with no vision tower included).
std::unique_ptr<VisionTower> load_vision_tower(const std::string& dir, const Metadata& config,
                                               const LoadOptions& options);

}  // namespace llmd
