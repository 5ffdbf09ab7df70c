// The elementwise pieces of a decoder step as mx::compile'd MLX functions: RMSNorm (of rows and
// of heads), the gated activations (SwiGLU, GeGLU), the logits' soft-capping, the quantized-KV
// rounding and its inverse, and RoPE with the split of a fused q|k|v projection that attention
// writes to KV.
//
// Why: MLX's compile fuses a run of elementwise ops (and their broadcasts) into one `Compiled`
// node, one kernel that reads its inputs once, where the same ops built one by one are a node
// and a pass over memory each. Where a fast op has a kernel of its own (mx::fast::rms_norm and
// rope on Metal and CUDA) it stays one node inside the compiled function; where it falls back
// to its decomposition (MLX's CPU device), the decomposition's elementwise tail fuses. A
// compiled function is traced once per input shape (once per dtype and rank when shapeless)
// and replayed from its cache after that.
//
// What cannot be compiled (measured on MLX 0.32.4, see bench/README.md, issue 22): the whole
// layer. Its attention reads a KV length that grows every step (a new trace per step unless
// shapeless), and shapeless compile needs every primitive to infer its output shape from its
// inputs, which Slice, Reshape and the KV scatter cannot (their shapes are parameters); the
// matmuls and the scatter would stay nodes of their own inside a compiled layer anyway. So the
// pieces between them are compiled: shapeless where every op allows it, else per shape.
#pragma once

#include <optional>
#include <utility>

#include <mlx/mlx.h>

#include "../core/kv_cache.h"
#include "rope.h"

namespace llmd {

namespace mx = mlx::core;

// mx::fast::rms_norm(x, w, eps) over x's last axis, compiled shapeless (one function per eps;
// the decomposition's mean reads the width at run time, a NumberOfElements node).
mx::array rms_norm(const mx::array& x, const mx::array& w, float eps);
// RMSNorm of each head of x [rows, heads * head_dim] (QK-norm: Qwen3, Gemma 3 and 4; Gemma 4's
// weightless value norm when `w` is empty), w [head_dim]; compiled shapeless over rows (one
// function per heads, head_dim, eps and weighted or not: the split into heads is a parameter).
mx::array rms_norm_heads(const mx::array& x, const std::optional<mx::array>& w, int heads, int head_dim, float eps);
// silu(g) * u (SwiGLU's activation), compiled shapeless.
mx::array silu_mul(const mx::array& g, const mx::array& u);
// gelu_tanh(g) (gelu_pytorch_tanh), and gelu_tanh(g) * u (GeGLU), compiled shapeless.
mx::array gelu_tanh(const mx::array& g);
mx::array gelu_tanh_mul(const mx::array& g, const mx::array& u);
// cap * tanh(x / cap) (final logit soft-capping), compiled shapeless.
mx::array softcap(const mx::array& x, float cap);

// GGML's q8_0 / q4_0 rounding (kv_quant.h) of rows x [rows, width] (quantized KV, written
// as a step stores its keys and values): the codes ([rows, width] int8, or [rows, width / 2]
// uint8 in GGML's nibble order) and the float16 scales [rows, width / 32]. Compiled shapeless
// over rows (one function per type and width).
std::pair<mx::array, mx::array> quantize_kv_rows(const mx::array& x, KvType type);
// Rows of codes and their scales back to numbers [rows, width] in dtype `dt` (the product is
// exact in float32, then rounded once to dt); compiled shapeless over rows.
mx::array dequantize_kv_rows(const mx::array& codes, const mx::array& scales, KvType type, mx::Dtype dt);

// The rows of a fused projection x [rows, (heads + 2 * kv_heads) * head_dim] (or the queries
// alone, [rows, heads * head_dim], when `with_kv` is false) split for attention: queries and
// keys rotated together by mx::fast::rope, each row at its own position (`positions` [rows]
// int32, `freqs` [dims / 2] float32 periods as fast::rope takes them), compiled per shape.
struct RopedRows {
  mx::array q;  // [rows, heads, 1, head_dim]
  mx::array k;  // [rows, kv_heads * head_dim] (empty when !with_kv)
  mx::array v;  // [rows, kv_heads * head_dim]
};
RopedRows rope_rows(const mx::array& x, const mx::array& positions, const mx::array& freqs, const Rope& rope,
                    int heads, int kv_heads, int head_dim, bool with_kv);

}  // namespace llmd
