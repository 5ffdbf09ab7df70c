// CPU primitives for the encoder models' work between their matmuls (bert.cpp on the host
// backend). MLX's CPU ops run that work on one thread and, for erf and exp, one float at a
// time (libm calls): in a BERT layer the erf of the GELU alone cost more than all the matmuls,
// and attention ran as one SDPA (and its slices, transposes and copies) per input and layer.
// These run each op in one pass, vectorized (cloned per ISA) and spread over the engine's
// threads; every row is computed the same way whichever batch it is in.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <mlx/mlx.h>
#include <mlx/primitives.h>

#include "rope.h"

namespace llmd {

namespace mx = mlx::core;

// The inputs of one encoder step: (first row, rows) of each input in the packed rows.
using EncoderSpans = std::vector<std::pair<int, int>>;

// Bidirectional attention within each span (spans never see one another): qkv [rows, 3 * heads
// * head_dim] (q | k | v), plus `bias` ([3 * heads * head_dim]) when given, `rope` (positions
// numbered from 0 in each span) on q and k when given. Returns [rows, heads * head_dim].
// Runs the CPU flash-attention tile kernels (attention_kernels.h) with every query seeing its
// whole span: no padding, no mask. head_dim must be a multiple of 16 (supports_encoder_attention).
mx::array encoder_attention(const mx::array& qkv, const std::optional<mx::array>& bias,
                            std::shared_ptr<const EncoderSpans> spans, int heads, int head_dim,
                            std::shared_ptr<const Rope> rope);
bool supports_encoder_attention(int head_dim);

// gelu(x + bias) (erf form, or the tanh approximation) of x [rows, n], bias [n] when given.
mx::array bias_gelu(const mx::array& x, const std::optional<mx::array>& bias, bool tanh_approx);

// LayerNorm(x + bias + residual) * weight + shift over the last axis of x [rows, n] (bias [n]
// and residual [rows, n] when given): a post-LN layer's bias add, residual and norm in one pass.
mx::array add_layer_norm(const mx::array& x, const std::optional<mx::array>& bias,
                         const std::optional<mx::array>& residual, const mx::array& weight, const mx::array& shift,
                         float eps);

}  // namespace llmd
