// Vision towers: what turns a preprocessed image into the rows a multimodal decoder reads in
// place of its image placeholder tokens. One tower per architecture file (siglip.cpp: Gemma 3;
// qwen_vision.cpp: Qwen3.5; gemma4_vision.cpp: Gemma 4).
// A tower is separate from the decoder (Model): it runs whole images through a bidirectional
// encoder with no KV cache, and the engine only ever sees the embeddings it produces.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "../core/metadata.h"
#include "../core/model.h"

namespace llmd {

struct VisionInfo {
  std::string architecture;  // "gemma3", "qwen3_5_moe", "gemma4"
  int image_size = 0;        // square images of image_size x image_size pixels; 0: any size (patches)
  int channels = 3;
  int tokens_per_image = 0;  // embedding rows per image; 0: per image, from its grid
  int hidden_size = 0;       // width of each row: the text decoder's hidden size
  int patch_values = 0;      // towers of any image size: values per flattened patch
  int merge_size = 1;        // ... and patches per token along each side (merged 2x2: 2; Gemma 4 pooled 3x3: 3)
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;
  virtual const VisionInfo& info() const = 0;
  // `n` images as float32 [n, channels, image_size, image_size] (the processor's normalized
  // pixels) -> float32 [n, tokens_per_image, hidden_size], in one batched pass.
  virtual std::vector<float> encode(const float* pixels, int n) const = 0;
  // Towers that read images of any size as flattened patches (Qwen3.5, Gemma 4; image_size 0): the
  // images' patches, float32 [sum of h * w, patch_values] in the processor's order, with each
  // image's patch grid (t, h, w) -> float32 [sum of h * w / merge_size^2, hidden_size].
  virtual std::vector<float> encode_patches(const float* patches, const std::vector<std::array<int, 3>>& grids) const;
};

// The vision half of a Hugging Face multimodal checkpoint directory; `config` is its whole
// config.json flattened ("vision_config.hidden_size", "mm_tokens_per_image", ...). When `dir`
// is a file, it is llama.cpp's mmproj GGUF (the vision half of a GGUF model; `config` unused).
// Throws naming what is missing or unsupported (a checkpoint with no vision tower included).
std::unique_ptr<VisionTower> load_vision_tower(const std::string& dir, const Metadata& config,
                                               const LoadOptions& options);

}  // namespace llmd
