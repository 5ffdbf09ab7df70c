// The cuda backend's decoder: a Llama-family forward pass driven by llmd's own kernels
// (matmul.h, attention.h), each decode step replayed as one CUDA graph. The architecture's
// loader (native/mlx/llama.cpp) reads the hyperparameters and RoPE tables once for every
// backend and hands them here, so what a model is stays written once per architecture; only
// how a step runs differs. Why the step is driven here rather than as MLX primitives on MLX's
// CUDA backend: README.md in this folder.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/gguf_file.h"
#include "../core/model.h"

namespace llmd::cuda {

struct LlamaConfig {
  int n_layers = 0;
  int hidden_size = 0;
  int ffn_size = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int context_length = 0;
  float rms_eps = 1e-5f;
  std::vector<float> rope_inv_freq;  // rope_dims / 2 values
  int rope_dims = 0;
  bool rope_interleaved = true;
  bool qkv_bias = false;  // Qwen2: q, k and v carry biases
  bool qk_norm = false;   // Qwen3: per-head RMS norm of q and k before RoPE
};

// True when this process can run the cuda backend (built with it and a CUDA device present).
bool cuda_available();
// "NVIDIA H100 80GB HBM3" and its total memory, for ModelInfo.
std::string device_name();
size_t device_memory_bytes();
std::pair<size_t, size_t> device_memory_info();  // (free, total) bytes

// Nodes (kernel launches and copies) of the CUDA graph a cuda model captured for decode steps
// of `seqs` sequences; -1 if `model` is not a cuda model or has no such graph yet. The benchmark
// reports it: the launches per decode step are what the graph replaces.
int decode_graph_nodes(const Model& model, int seqs);

// Uploads the GGUF file's weights to the GPU and returns the model; `info` is the loader's
// (architecture, sizes), to which the backend facts are added.
std::unique_ptr<Model> load_llama(const GgufFile& file, const LlamaConfig& config, ModelInfo info);

}  // namespace llmd::cuda
