// What one engine step runs: token chunks of several sequences sharing one forward pass.
// Plain data, printable and testable without a model (vLLM's SchedulerOutput idea).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kv_cache.h"

namespace llmd {

// What a segment needs of the final hidden states (after the model's final norm): nothing, the
// last fed row's (last-token pooling), the sum of all its fed rows' (mean pooling, which
// the engine divides once the whole prompt has been summed over its chunks), or the first
// row's (CLS pooling: only bidirectional models, whose segments are always whole prompts), or
// every fed row's (All: an MTP head drafts from the model's hidden state at each position; only
// models with Model::mtp() honour it).
enum class HiddenOut { None, Last, Sum, First, All };

struct StepSegment {
  SequenceKv* kv = nullptr;      // KV of the sequence; positions [0, start_pos) already filled
  std::vector<int32_t> tokens;   // tokens fed this step, at positions start_pos...
  int start_pos = 0;
  bool want_logits = false;      // sample a token after the last fed token
  // With want_logits: how many of the last fed rows return logits (speculative decoding
  // verifies drafted tokens: the rows after the sequence's last token and each draft).
  int logits_tail = 1;
  HiddenOut hidden = HiddenOut::None;  // embeddings: see HiddenOut
  // Models with recurrent state: positions p in (start_pos, start_pos + tokens] (block
  // boundaries) after which the model records a copy of the state into kv->snapshots.
  std::vector<int> snapshot_at;
  // Rows fed as embeddings instead of token ids (an image's rows): empty (every row a token,
  // as before) or one entry per fed row: null for a token row, else hidden_size floats the
  // model reads in place of that row's token embedding, unscaled (tokens[i] is then a
  // surrogate id, GenerateRequest::PromptEmbeddings, never looked up).
  std::vector<const float*> embeddings;
  // Attention past a row's own position: empty (causal, as before) or one entry per fed row:
  // the position up to which (exclusive) the row attends when that lies past the row itself
  // (Gemma 3: an image's rows see the whole image, all fed in this step), else 0.
  std::vector<int> attend_to;
  // Multimodal rotary positions (Qwen3.5's M-RoPE): empty (row i at position start_pos + i on
  // every axis, as before) or one (t, h, w) per fed row, for sequences whose prompt holds an
  // image laid out on a grid (GenerateRequest::PromptEmbeddings::grid_h/grid_w). Only models
  // with M-RoPE read it; their KV index stays start_pos + i.
  std::vector<std::array<int32_t, 3>> mrope;
  // Set by the engine on a decode row whose token the device may pick (Model::
  // samples_on_device; native/mlx/device_sampler.h): the request's sampling settings and the
  // uniform number in [0, 1) its generator drew for this token (unused when greedy).
  struct DeviceSample {
    float temperature = 0.f;
    int top_k = 0;
    float top_p = 1.f;
    float min_p = 0.f;
    double unit = 0.0;
  };
  std::optional<DeviceSample> device_sample;
};

struct Step {
  std::vector<StepSegment> segments;
  // Written by forward(): empty when every logits row came back in `logits`, else one entry
  // per logits row (segment order): the token the device sampled, or -1 for a row whose
  // logits are the next in `logits` (only those rows are returned).
  mutable std::vector<int32_t> device_tokens;

  int total_tokens() const {
    int n = 0;
    for (const auto& s : segments) n += static_cast<int>(s.tokens.size());
    return n;
  }
  int logits_rows() const {
    int n = 0;
    for (const auto& s : segments) n += s.want_logits ? s.logits_tail : 0;
    return n;
  }
  int hidden_rows() const {
    int n = 0;
    for (const auto& s : segments) {
      n += s.hidden == HiddenOut::All ? static_cast<int>(s.tokens.size()) : s.hidden != HiddenOut::None ? 1 : 0;
    }
    return n;
  }
};

}  // namespace llmd
