// The backend-independent face of a loaded model: the engine schedules Steps and samples from
// the logits; an architecture file (native/mlx/<arch>.cpp) implements forward().
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "metadata.h"
#include "step.h"

namespace llmd {

struct ModelInfo {
  std::string architecture;
  int vocab_size = 0;
  int context_length = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int hidden_size = 0;
  std::string weight_format;
  size_t weight_bytes = 0;
  std::string backend;      // "cpu" (llmd's kernels), "gpu" or "mlx-cpu" (MLX's kernels)
  std::string device_name;  // e.g. "NVIDIA H100 80GB HBM3", or the CPU kernel path
  size_t device_memory_bytes = 0;  // total memory of the GPU, 0 on the CPU backend
};

// A multi-token-prediction head shipped inside a checkpoint (Qwen3.5's `mtp.*`): one decoder
// layer of its own, with its own KV, that guesses the token after next from the model's final
// hidden state at a position and the embedding of the token that follows it. The engine's
// MtpDrafter (mtp_drafter.h) chains it to draft several tokens.
class MtpHead {
 public:
  virtual ~MtpHead() = default;
  // The KV of the head's one attention layer (a pool of its own).
  virtual KvShape kv_shape() const = 0;
  // Runs the step over the head's KV in `pool`. Row r of the step (segments in order, tokens in
  // order) is entry (hidden_in[r], token): hidden_in holds hidden_size floats per row, the
  // model's final hidden state at the row's position (or, chained, the head's own output of
  // the previous entry), and the token is the one at the next position. Writes, for every row
  // that returns logits (as Model::forward: the last logits_tail rows of want_logits
  // segments), its logits into `logits` and the head's normalised output into `hidden_out`.
  virtual void forward(const Step& step, KvPool& pool, const std::vector<float>& hidden_in, std::vector<float>& logits,
                       std::vector<float>& hidden_out) = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  virtual ModelInfo& mutable_info() = 0;  // for the loader to fill in backend facts
  virtual KvShape kv_shape() const = 0;
  // Which matmul path each weight runs, e.g. {"blk.attn_qkv": "llmd:q4_1:avx512vnni"}.
  virtual std::map<std::string, std::string> matmul_paths() const = 0;
  // How many attention calls read KV by each path (the device backend's, e.g. "decode_lanes"
  // vs "decode_gather": native/mlx/decode_lanes.h); empty where there is one path.
  virtual std::map<std::string, uint64_t> attention_paths() const { return {}; }
  // Runs the step, writing new KV into `pool` and the logits of every segment with
  // want_logits (in segment order) into `logits` as [rows, vocab].
  virtual void forward(const Step& step, KvPool& pool, std::vector<float>& logits) = 0;
  // As forward(), also writing one row [hidden_size] per segment whose `hidden` is not None
  // (segment order) into `hidden`: the final-norm hidden state of its last row, or the sum
  // over its rows. Only architectures with supports_hidden() implement it (embedding models).
  virtual void forward(const Step& step, KvPool& pool, std::vector<float>& logits, std::vector<float>& hidden) {
    if (step.hidden_rows() > 0) throw std::runtime_error(info().architecture + " cannot output hidden states");
    hidden.clear();
    forward(step, pool, logits);
  }
  virtual bool supports_hidden() const { return false; }
  // The checkpoint's multi-token-prediction head, or null. A model with one honours
  // HiddenOut::All in forward(): every fed row's final hidden state, what the head reads.
  virtual MtpHead* mtp() { return nullptr; }
  // True when forward() samples the rows that ask for it (StepSegment::device_sample) where
  // the logits are, returning their tokens instead of their logits (Step::device_tokens).
  virtual bool samples_on_device() const { return false; }
  // Copies KV block `src` into block `dst` wherever this backend keeps KV (a sibling sequence
  // forked from a prefilled prompt gets its own copy of the partial last block).
  virtual void copy_kv_block(KvPool& pool, int src, int dst) { pool.copy_block(src, dst); }
  // True when some layers keep per-sequence recurrent state (SequenceKv::state) instead of, or
  // beside, KV. The engine then reuses a cached prefix only where a snapshot of the state at
  // exactly that position exists (engine.cpp, admit), and forks copy the state.
  virtual bool has_recurrent_state() const { return false; }
  // True for encoders (BERT, nomic-bert) and EmbeddingGemma (gemma3.cpp with bidirectional
  // attention): positions attend to later ones too, so a prompt runs whole in one step (never
  // chunked: an early chunk would miss the later tokens) and never from the prefix cache (a
  // cached position's state depends on what follows it).
  virtual bool bidirectional() const { return false; }
  // True when forward() honours StepSegment::embeddings and attend_to (rows fed as
  // embeddings: images); the engine refuses requests with embedded rows otherwise.
  virtual bool accepts_embeddings() const { return false; }
  // True when forward() places rows by StepSegment::mrope (Qwen3.5's multimodal rotary):
  // requests whose images carry a grid are refused by other models.
  virtual bool uses_mrope() const { return false; }
  // False for a backend that keeps KV only in floats (the cuda backend so far): the engine then
  // refuses --kv-type q8_0/q4_0 at construction instead of ignoring it.
  virtual bool supports_quantized_kv() const { return true; }
  // The disk tier's access to KV blocks wherever this backend keeps them (kv_disk.h): copies
  // every layer's keys and values of `blocks` out to `out` (one buffer per block), or in from
  // `in`, as the pool counts them: a block's full-attention layers (block_bytes()), or with
  // `window` its window part (window_part_bytes()). The layout inside a block is the backend's
  // own (the engine names it in the tier's identity); host storage copies the pool's bytes.
  // False from has_kv_block_io() where a backend cannot (the tier is then off).
  virtual bool has_kv_block_io() const { return kv_shape().host_storage; }
  virtual void read_kv_blocks(KvPool& pool, const std::vector<int>& blocks, bool window,
                              const std::vector<std::byte*>& out) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      const std::byte* from = pool.part_data(blocks[i], window);
      std::copy(from, from + pool.part_bytes(window), out[i]);
    }
  }
  virtual void write_kv_blocks(KvPool& pool, const std::vector<int>& blocks, bool window,
                               const std::vector<const std::byte*>& in) {
    for (size_t i = 0; i < blocks.size(); ++i) std::copy(in[i], in[i] + pool.part_bytes(window), pool.part_data(blocks[i], window));
  }
  // Models with recurrent state: the bytes of one state snapshot as the disk tier stores it
  // (0: it cannot be stored, and the tier is off), a snapshot into them, and them back into a
  // state. A snapshot is what a prefix of such a model resumes from (has_recurrent_state).
  virtual size_t state_bytes() const { return 0; }
  virtual void save_state(const SequenceState& /*state*/, std::byte* /*out*/) const {}
  virtual std::unique_ptr<SequenceState> load_state(const std::byte* /*in*/) const { return nullptr; }
  // The model's own head over one pooled vector of hidden_size values, before any
  // normalisation: a cross-encoder's classifier turns it into its label scores. Models
  // without one leave it as it is.
  virtual void project_pooled(std::vector<float>& /*values*/) const {}
};

struct LoadOptions {
  int context_length = 0;  // 0: the model's own
  // "auto" (the GPU when MLX has one, else "cpu"), "cpu" (llmd's SIMD kernels over GGUF
  // blocks), "gpu" (MLX's kernels on its GPU: CUDA or Metal), or "mlx-cpu" (the GPU backend's
  // graph on MLX's CPU device: slow, but it runs the device code path where no GPU exists).
  std::string backend = "auto";
  bool on_device() const { return backend == "gpu" || backend == "mlx-cpu"; }
  // The pull-time support check: every check the loader makes (architecture, hyperparameters,
  // tensor presence, shapes and types) runs, but no weight bytes are copied, packed or
  // dequantized, so a file of any size is checked in about the time its header takes to read.
  // The model that comes back cannot run a forward.
  bool validate_only = false;
};

// Loads a GGUF file or a Hugging Face safetensors directory; throws std::runtime_error with a
// message naming what is unsupported.
std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& options,
                                  const Metadata& hf_config);

}  // namespace llmd
