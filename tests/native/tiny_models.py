"""Tiny random checkpoints of each architecture, built deterministically with numpy only.

The same builders serve the tests (llmd's engine loads them) and the fixture recorder
(tests/fixtures/record_transformers.py runs transformers on them in its own venv), so both sides
see byte-identical weights. Weights are stored as bf16 (values rounded here, so a float32
reference computes with exactly the stored numbers); GGUF copies keep them in F32.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "vocab_size": 128,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

CONFIGS: dict[str, dict] = {
    # Qwen2.5-shaped: q/k/v biases, tied embeddings, large rope theta.
    "qwen2": {
        **_BASE,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
    },
    # Qwen3: QK-norm, head_dim (32) != hidden / heads (16), untied.
    "qwen3": {
        **_BASE,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
    },
    # Gemma 3 text: two sliding layers (window 5) then a global one, local/global rope bases,
    # linear rope scaling on the global layer, query_pre_attn_scalar != head_dim and final
    # logit soft-capping, so each of them changes the logits. Untied: a tiny random Gemma with
    # tied embeddings mostly echoes its last token (embeddings scaled by sqrt(hidden)).
    "gemma3_text": {
        **_BASE,
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 24,
        "final_logit_softcapping": 3.0,
        "attn_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": False,
    },
    # Qwen3.5-MoE text model: three gated delta-rule linear-attention layers then a gated full
    # attention one (QK-norm, RoPE on a quarter of each head), every layer a 6-expert top-2 MoE
    # with a shared expert. Decays chosen so the recurrent state remembers over many tokens.
    "qwen3_5_moe_text": {
        **{k: v for k, v in _BASE.items() if k != "intermediate_size"},
        "model_type": "qwen3_5_moe_text",
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "hidden_act": "silu",
        "attention_bias": False,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "tie_word_embeddings": False,
    },
    # Gemma 4 text with every dense layer kind: sliding layers (window 5, head_dim 16, 2 KV
    # heads, default rope) and full ones (head_dim 32, 1 KV head, keys = values, proportional
    # rope rotating a quarter of the frequencies); per-layer input embeddings; the last two
    # layers (one of each type) read the KV of layers 1 and 2 and have double-wide MLPs; each
    # layer's output scaled by its layer_scalar; final soft-capping. Untied (see Gemma 3).
    "gemma4_text": {
        **_BASE,
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": 5,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "rms_norm_eps": 1e-6,
        "sliding_window": 5,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 128,
        "enable_moe_block": False,
        "final_logit_softcapping": 5.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "pad_token_id": 0,
        "tie_word_embeddings": False,
    },
    # Gemma 4 with the MoE block (4 experts, top 2, beside the dense MLP in every layer), no
    # per-layer inputs, no KV sharing, separate values on the full layer, whose shape (head_dim
    # 32, 1 KV head) comes as transformers 5.23 serialises it (per_layer_config), default rope
    # on both layer types, no soft-capping.
    "gemma4_moe": {
        **_BASE,
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 16,
        "per_layer_config": {"2": {"head_dim": 32, "num_key_value_heads": 1}},
        "attention_k_eq_v": False,
        "rms_norm_eps": 1e-6,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
        "final_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "pad_token_id": 0,
        "tie_word_embeddings": False,
    },
}
# Dense Qwen3.5 text model: the same hybrid layers as qwen3_5_moe_text with a SwiGLU MLP in
# every layer instead of the experts.
CONFIGS["qwen3_5_text"] = {
    **{
        k: v
        for k, v in CONFIGS["qwen3_5_moe_text"].items()
        if not k.startswith(("num_experts", "moe_", "shared_expert"))
    },
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "intermediate_size": 96,
}

# Token ids every architecture is scored on: longer than Gemma's window, so windowing shows.
TOKENS = [1, 17, 99, 5, 64, 2, 120, 33, 8, 71, 44, 90, 12, 7, 101, 56, 23, 88, 3, 65]
# A sequence long enough that sliding-window layers drop the window parts of its first blocks
# (window + the pool's two-block margin < 300): the fixtures keep the logits of its last
# LONG_SCORED positions.
LONG_TOKENS = [1] + [int(t) for t in np.random.default_rng(7).integers(3, 128, 299)]
LONG_SCORED = 8


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32."""
    return (_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def weights(arch: str, seed: int = 0, config: dict | None = None) -> dict[str, np.ndarray]:
    """Hugging Face tensor names -> float32 arrays (bf16-representable values). `config`
    replaces CONFIGS[arch] (other sizes of the same architecture)."""
    if arch in ("qwen3_5_moe_text", "qwen3_5_text"):
        return _qwen3_5_moe_weights(seed, config or CONFIGS[arch])
    c = config or CONFIGS[arch]
    rng = np.random.default_rng(seed)
    if c["model_type"] == "gemma4_text":
        return {k: bf16_round(x.astype(np.float32)) for k, x in _gemma4_weights(c, rng).items()}
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", h // nh)
    gemma = arch == "gemma3_text"

    def norm(n: int) -> np.ndarray:  # Gemma stores w for (1 + w)
        return 0.1 * rng.normal(size=n) if gemma else 1 + 0.1 * rng.normal(size=n)

    w: dict[str, np.ndarray] = {
        # Gemma scales embeddings by sqrt(hidden): keep the residual stream near unit scale.
        "model.embed_tokens.weight": rng.normal(0, h**-0.5 if gemma else 1, (v, h)),
        "model.norm.weight": norm(h),
    }
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.normal(0, 0.2, (v, h))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[a + "q_proj.weight"] = rng.normal(0, 0.15, (nh * hd, h))
        w[a + "k_proj.weight"] = rng.normal(0, 0.15, (nkv * hd, h))
        w[a + "v_proj.weight"] = rng.normal(0, 0.15, (nkv * hd, h))
        w[a + "o_proj.weight"] = rng.normal(0, 0.15, (h, nh * hd))
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.15, (f, h))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.15, (f, h))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.15, (h, f))
        if arch == "qwen2":
            w[a + "q_proj.bias"] = rng.normal(0, 0.3, nh * hd)
            w[a + "k_proj.bias"] = rng.normal(0, 0.3, nkv * hd)
            w[a + "v_proj.bias"] = rng.normal(0, 0.3, nkv * hd)
        if arch in ("qwen3", "gemma3_text"):
            w[a + "q_norm.weight"] = norm(hd)
            w[a + "k_norm.weight"] = norm(hd)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(h)
            w[p + "post_feedforward_layernorm.weight"] = norm(h)
    return {k: bf16_round(x.astype(np.float32)) for k, x in w.items()}


def _qwen3_5_moe_weights(seed: int, config: dict | None = None) -> dict[str, np.ndarray]:
    c = config or CONFIGS["qwen3_5_moe_text"]
    rng = np.random.default_rng(seed)
    h, v = c["hidden_size"], c["vocab_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    dense = "num_experts" not in c  # Qwen3.5 (dense): a SwiGLU MLP per layer
    if not dense:
        e, f, fs = (
            c["num_experts"],
            c["moe_intermediate_size"],
            c["shared_expert_intermediate_size"],
        )

    def norm(n: int) -> np.ndarray:  # stored w of (1 + w)
        return 0.1 * rng.normal(size=n)

    def mat(*shape: int, scale: float = 0.15) -> np.ndarray:
        return rng.normal(0, scale, shape)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.normal(0, 1, (v, h)),
        "model.norm.weight": norm(h),
        "lm_head.weight": mat(v, h, scale=0.2),
    }
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        if kind == "linear_attention":
            a = p + "linear_attn."
            w[a + "in_proj_qkv.weight"] = mat(conv_dim, h)
            w[a + "in_proj_z.weight"] = mat(nv * dv, h)
            w[a + "in_proj_b.weight"] = mat(nv, h, scale=0.3)
            w[a + "in_proj_a.weight"] = mat(nv, h, scale=0.3)
            w[a + "conv1d.weight"] = mat(conv_dim, 1, c["linear_conv_kernel_dim"], scale=0.4)
            w[a + "dt_bias"] = rng.normal(0, 0.5, nv)
            w[a + "A_log"] = np.log(rng.uniform(0.05, 0.5, nv))
            w[a + "norm.weight"] = 1 + 0.1 * rng.normal(size=dv)
            w[a + "out_proj.weight"] = mat(h, nv * dv)
        else:
            a = p + "self_attn."
            w[a + "q_proj.weight"] = mat(2 * nh * hd, h)
            w[a + "k_proj.weight"] = mat(nkv * hd, h)
            w[a + "v_proj.weight"] = mat(nkv * hd, h)
            w[a + "o_proj.weight"] = mat(h, nh * hd)
            w[a + "q_norm.weight"] = norm(hd)
            w[a + "k_norm.weight"] = norm(hd)
        m = p + "mlp."
        if dense:
            ff = c["intermediate_size"]
            w[m + "gate_proj.weight"] = mat(ff, h)
            w[m + "up_proj.weight"] = mat(ff, h)
            w[m + "down_proj.weight"] = mat(h, ff, scale=0.1)
            continue
        w[m + "gate.weight"] = mat(e, h, scale=0.3)
        w[m + "experts.gate_up_proj"] = mat(e, 2 * f, h)
        w[m + "experts.down_proj"] = mat(e, h, f)
        w[m + "shared_expert.gate_proj.weight"] = mat(fs, h)
        w[m + "shared_expert.up_proj.weight"] = mat(fs, h)
        w[m + "shared_expert.down_proj.weight"] = mat(h, fs)
        w[m + "shared_expert_gate.weight"] = mat(1, h, scale=0.3)
    return {k: bf16_round(x.astype(np.float32)) for k, x in w.items()}


def gemma4_layer_shapes(c: dict) -> list[tuple[int, int, bool, int]]:
    """(head_dim, kv heads, KV-shared, MLP width) of each layer of a Gemma 4 text config."""
    n = c["num_hidden_layers"]
    types = c["layer_types"]
    first_shared = n - c.get("num_kv_shared_layers", 0)
    full = (c.get("global_head_dim", 512), c["num_key_value_heads"])
    if c.get("attention_k_eq_v") and c.get("num_global_key_value_heads"):
        full = (full[0], c["num_global_key_value_heads"])
    plc = {int(k): v for k, v in c.get("per_layer_config", {}).items()}
    out = []
    for i in range(n):
        hd, kv = (
            (c["head_dim"], c["num_key_value_heads"]) if types[i] == "sliding_attention" else full
        )
        if plc:
            o = plc.get(i, {})
            hd = o.get("head_dim", c["head_dim"])
            kv = o.get("num_key_value_heads", c["num_key_value_heads"])
        shared = i >= first_shared
        wide = 2 if shared and c.get("use_double_wide_mlp") else 1
        out.append((hd, kv, shared, c["intermediate_size"] * wide))
    return out


def _gemma4_weights(c: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, v, nh = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    n = c["num_hidden_layers"]
    P = c.get("hidden_size_per_layer_input", 0)

    def norm(size: int) -> np.ndarray:  # Gemma4RMSNorm multiplies by w
        return 1 + 0.1 * rng.normal(size=size)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.normal(0, h**-0.5, (v, h)),
        "model.norm.weight": norm(h),
    }
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.normal(0, 0.2, (v, h))
    if P:
        w["model.embed_tokens_per_layer.weight"] = rng.normal(
            0, P**-0.5, (c["vocab_size_per_layer_input"], n * P)
        )
        w["model.per_layer_model_projection.weight"] = rng.normal(0, 0.15, (n * P, h))
        w["model.per_layer_projection_norm.weight"] = norm(P)
    for i, (hd, kv, shared, f) in enumerate(gemma4_layer_shapes(c)):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        full = c["layer_types"][i] == "full_attention"
        for name in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            w[f"{p}{name}_layernorm.weight"] = norm(h)
        w[p + "layer_scalar"] = rng.uniform(0.5, 1.5, 1)
        w[a + "q_proj.weight"] = rng.normal(0, 0.15, (nh * hd, h))
        w[a + "q_norm.weight"] = norm(hd)
        if not shared:
            w[a + "k_proj.weight"] = rng.normal(0, 0.15, (kv * hd, h))
            w[a + "k_norm.weight"] = norm(hd)
            if not (full and c.get("attention_k_eq_v")):
                w[a + "v_proj.weight"] = rng.normal(0, 0.15, (kv * hd, h))
        w[a + "o_proj.weight"] = rng.normal(0, 0.15, (h, nh * hd))
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.15, (f, h))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.15, (f, h))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.15, (h, f))
        if P:
            w[p + "per_layer_input_gate.weight"] = rng.normal(0, 0.3, (P, h))
            w[p + "per_layer_projection.weight"] = rng.normal(0, 0.3, (h, P))
            w[p + "post_per_layer_input_norm.weight"] = norm(h)
        if c.get("enable_moe_block"):
            e, mi = c["num_experts"], c["moe_intermediate_size"]
            w[p + "router.proj.weight"] = rng.normal(0, 1.0, (e, h))
            w[p + "router.scale"] = norm(h)
            w[p + "router.per_expert_scale"] = 1 + 0.2 * rng.normal(size=e)
            w[p + "experts.gate_up_proj"] = rng.normal(0, 0.15, (e, 2 * mi, h))
            w[p + "experts.down_proj"] = rng.normal(0, 0.15, (e, h, mi))
            w[p + "post_feedforward_layernorm_1.weight"] = norm(h)
            w[p + "pre_feedforward_layernorm_2.weight"] = norm(h)
            w[p + "post_feedforward_layernorm_2.weight"] = norm(h)
    return w


def write_multimodal_checkpoint(
    path: Path,
    text_arch: str,
    tensors: dict[str, np.ndarray],
    *,
    model_type: str,
    architecture: str,
    vision_type: str,
    drop: tuple[str, ...] = ("tie_word_embeddings",),
    vision_config: dict | None = None,
    extra: dict | None = None,
    text_update: dict | None = None,
    preprocessor: dict | None = None,
) -> dict:
    """A ...ForConditionalGeneration directory: `tensors` (already under the multimodal
    names, vision tower included) and a config nesting `text_arch`'s config (less `drop`, with
    `text_update`'s keys) as its text_config beside `vision_config` (a stub when not given) and
    the `extra` top-level keys, the head untied by the outer config; `preprocessor`, when given,
    as preprocessor_config.json beside it. Returns the config."""
    path.mkdir(parents=True, exist_ok=True)
    write_safetensors(path / "model.safetensors", tensors)
    text_config = {k: v for k, v in CONFIGS[text_arch].items() if k not in drop}
    config = {
        "model_type": model_type,
        "architectures": [architecture],
        "text_config": {**text_config, **(text_update or {})},
        "vision_config": vision_config or {"model_type": vision_type, "hidden_size": 8},
        "tie_word_embeddings": False,
        **(extra or {}),
    }
    (path / "config.json").write_text(json.dumps(config))
    if preprocessor is not None:
        (path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return config


def multimodal_text_weights(text_arch: str, prefix: str) -> dict[str, np.ndarray]:
    """`text_arch`'s tiny weights as a ...ForConditionalGeneration's language model: the
    `model.*` tensors under `prefix` ("language_model.model.": transformers 4's names, as the
    Gemma 3 releases; "model.language_model.": transformers 5's), the head's as they are."""
    return {
        (prefix + k.removeprefix("model.") if k.startswith("model.") else k): v
        for k, v in weights(text_arch).items()
    }


# Gemma 3's SigLIP tower at toy size: 64x64 images in 4x4-pixel patches (a 16x16 grid),
# pooled 4x4 into 16 image tokens, as the released 896 / 14 = 64-patch grid pools into 256.
GEMMA3_VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_channels": 3,
    "image_size": 64,
    "patch_size": 4,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}
# The multimodal wrapper's own keys: 16 tokens per image, and the image markers inside the
# tiny 128-token vocabulary (the tokenizer the served tests build names them).
GEMMA3_MULTIMODAL = {
    "mm_tokens_per_image": 16,
    "boi_token_index": 125,
    "eoi_token_index": 126,
    "image_token_id": 127,
    "image_token_index": 127,
}


def gemma3_vision_weights(
    seed: int = 1, vision: dict | None = None, text_hidden: int | None = None, scale: float = 1.0
) -> dict[str, np.ndarray]:
    """The vision tower and projector of a tiny Gemma 3, under the released checkpoints'
    names (bf16-representable values). `vision` replaces GEMMA3_VISION and `text_hidden` the
    text width (other sizes: the bench's gemma-3-4b-shaped tower); `scale` multiplies the
    matrices' spread (a wide tower's activations stay in float16 range with less)."""
    c = vision or GEMMA3_VISION
    text_hidden = text_hidden or CONFIGS["gemma3_text"]["hidden_size"]
    rng = np.random.default_rng(seed)
    d, f, p = c["hidden_size"], c["intermediate_size"], c["patch_size"]
    grid = (c["image_size"] // p) ** 2

    def mat(std: float, *shape: int) -> np.ndarray:
        return rng.normal(0, std * scale, shape).astype(np.float32)

    m = "vision_tower.vision_model."
    w: dict[str, np.ndarray] = {
        m + "embeddings.patch_embedding.weight": mat(0.15, d, 3, p, p),
        m + "embeddings.patch_embedding.bias": rng.normal(0, 0.1, d),
        m + "embeddings.position_embedding.weight": rng.normal(0, 0.5, (grid, d)),
        m + "post_layernorm.weight": 1 + 0.1 * rng.normal(size=d),
        m + "post_layernorm.bias": 0.1 * rng.normal(size=d),
        "multi_modal_projector.mm_soft_emb_norm.weight": 0.1 * rng.normal(size=d),
        "multi_modal_projector.mm_input_projection_weight": mat(0.15, d, text_hidden),
    }
    for i in range(c["num_hidden_layers"]):
        b = f"{m}encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            w[f"{b}{norm}.weight"] = 1 + 0.1 * rng.normal(size=d)
            w[f"{b}{norm}.bias"] = 0.1 * rng.normal(size=d)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[f"{b}self_attn.{proj}.weight"] = mat(0.2, d, d)
            w[f"{b}self_attn.{proj}.bias"] = rng.normal(0, 0.1, d)
        w[b + "mlp.fc1.weight"] = mat(0.2, f, d)
        w[b + "mlp.fc1.bias"] = rng.normal(0, 0.1, f)
        w[b + "mlp.fc2.weight"] = mat(0.2, d, f)
        w[b + "mlp.fc2.bias"] = rng.normal(0, 0.1, d)
    return {k: bf16_round(x.astype(np.float32)) for k, x in w.items()}


def write_gemma3_multimodal(path: Path) -> dict:
    """A tiny Gemma3ForConditionalGeneration directory (transformers 4 names, as the released
    checkpoints): the gemma3_text weights as its language model, gemma3_vision_weights() as
    its vision half. Returns the config."""
    return write_multimodal_checkpoint(
        path,
        "gemma3_text",
        {
            **multimodal_text_weights("gemma3_text", "language_model.model."),
            **gemma3_vision_weights(),
        },
        model_type="gemma3",
        architecture="Gemma3ForConditionalGeneration",
        vision_type="siglip_vision_model",
        # Untied in the text config too: transformers 5 ties the head when text_config says
        # so (its default), whatever the outer config says.
        drop=(),
        vision_config=GEMMA3_VISION,
        extra=GEMMA3_MULTIMODAL,
        # No final soft-capping, as the released checkpoints: transformers 5.23's
        # Gemma3ForConditionalGeneration ignores the setting (its ForCausalLM applies it).
        text_update={"final_logit_softcapping": None},
    )


# Qwen3.5's vision encoder at toy size: 4x4-pixel patches over 2 frames (a still image is
# its frame twice), merged 2x2 into one token, so images come in multiples of 8 pixels a side
# and any grid of patches; learned positions on a 4x4 grid, resampled to each image's grid.
QWEN3_5_VISION = {
    "model_type": "qwen3_5_moe_vision",
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
    "hidden_act": "gelu_pytorch_tanh",
}
# The wrapper's own keys: the image markers inside the tiny 128-token vocabulary.
QWEN3_5_MULTIMODAL = {
    "image_token_id": 127,
    "video_token_id": 124,
    "vision_start_token_id": 125,
    "vision_end_token_id": 126,
}
# The image processor's settings for the toy encoder (preprocessor_config.json): images
# resized to between 256 and 1024 pixels in multiples of 8 a side.
QWEN3_5_PREPROCESSOR = {
    "size": {"shortest_edge": 256, "longest_edge": 1024},
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 3,
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
}


def qwen3_5_vision_weights(seed: int = 2) -> dict[str, np.ndarray]:
    """The vision encoder and merger of a tiny Qwen3.5, under transformers' names
    (bf16-representable values)."""
    c = QWEN3_5_VISION
    rng = np.random.default_rng(seed)
    d, f, p, t = c["hidden_size"], c["intermediate_size"], c["patch_size"], c["temporal_patch_size"]
    merged = d * c["spatial_merge_size"] ** 2
    m = "model.visual."
    w: dict[str, np.ndarray] = {
        m + "patch_embed.proj.weight": rng.normal(0, 0.15, (d, c["in_channels"], t, p, p)),
        m + "patch_embed.proj.bias": rng.normal(0, 0.1, d),
        m + "pos_embed.weight": rng.normal(0, 0.5, (c["num_position_embeddings"], d)),
        m + "merger.norm.weight": 1 + 0.1 * rng.normal(size=d),
        m + "merger.norm.bias": 0.1 * rng.normal(size=d),
        m + "merger.linear_fc1.weight": rng.normal(0, 0.1, (merged, merged)),
        m + "merger.linear_fc1.bias": rng.normal(0, 0.1, merged),
        m + "merger.linear_fc2.weight": rng.normal(0, 0.1, (c["out_hidden_size"], merged)),
        m + "merger.linear_fc2.bias": rng.normal(0, 0.1, c["out_hidden_size"]),
    }
    for i in range(c["depth"]):
        b = f"{m}blocks.{i}."
        for norm in ("norm1", "norm2"):
            w[f"{b}{norm}.weight"] = 1 + 0.1 * rng.normal(size=d)
            w[f"{b}{norm}.bias"] = 0.1 * rng.normal(size=d)
        w[b + "attn.qkv.weight"] = rng.normal(0, 0.2, (3 * d, d))
        w[b + "attn.qkv.bias"] = rng.normal(0, 0.1, 3 * d)
        w[b + "attn.proj.weight"] = rng.normal(0, 0.2, (d, d))
        w[b + "attn.proj.bias"] = rng.normal(0, 0.1, d)
        w[b + "mlp.linear_fc1.weight"] = rng.normal(0, 0.2, (f, d))
        w[b + "mlp.linear_fc1.bias"] = rng.normal(0, 0.1, f)
        w[b + "mlp.linear_fc2.weight"] = rng.normal(0, 0.2, (d, f))
        w[b + "mlp.linear_fc2.bias"] = rng.normal(0, 0.1, d)
    return {k: bf16_round(x.astype(np.float32)) for k, x in w.items()}


def write_qwen3_5_moe_multimodal(path: Path) -> dict:
    """A tiny Qwen3_5MoeForConditionalGeneration directory: the qwen3_5_moe_text weights as
    its language model (`model.language_model.*`), qwen3_5_vision_weights() as `model.visual`,
    the text rotary split by mrope_section [2, 1, 1] over its 4 frequencies (interleaved
    t, h, w, t, as transformers lays them out), and the image processor's settings beside it.
    Returns the config."""
    text_arch = "qwen3_5_moe_text"
    return write_multimodal_checkpoint(
        path,
        text_arch,
        {**multimodal_text_weights(text_arch, "model.language_model."), **qwen3_5_vision_weights()},
        model_type="qwen3_5_moe",
        architecture="Qwen3_5MoeForConditionalGeneration",
        vision_type="qwen3_5_moe_vision",
        drop=(),
        vision_config=QWEN3_5_VISION,
        extra=QWEN3_5_MULTIMODAL,
        text_update={
            "rope_parameters": {
                **CONFIGS[text_arch]["rope_parameters"],
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            }
        },
        preprocessor=QWEN3_5_PREPROCESSOR,
    )


# Gemma 4's vision encoder at toy size: 4x4-pixel patches pooled 3x3 into one soft token (so
# images come in multiples of 12 pixels a side, any aspect), grouped heads (2 query heads, 1
# K/V head), clipped linears whose bounds bite, standardized soft tokens; position tables of 64
# a side (the toy budget's tallest grid is 36 patches).
GEMMA4_VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "patch_size": 4,
    "pooling_kernel_size": 3,
    "position_embedding_size": 64,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "use_clipped_linears": True,
    "standardize": True,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
}
# The wrapper's own keys: the image and audio markers inside the tiny 128-token vocabulary.
GEMMA4_MULTIMODAL = {
    "image_token_id": 127,
    "boi_token_id": 125,
    "eoi_token_id": 126,
    "video_token_id": 124,
    "audio_token_id": 123,
    "boa_token_id": 122,
    "eoa_token_index": 121,
}
# The image processor's settings for the toy encoder (preprocessor_config.json): the smallest
# budget the processor takes (70 soft tokens: 630 patches).
GEMMA4_PREPROCESSOR = {
    "patch_size": 4,
    "pooling_kernel_size": 3,
    "max_soft_tokens": 70,
    "do_normalize": False,
    "image_processor_type": "Gemma4ImageProcessor",
    "processor_class": "Gemma4Processor",
}


def gemma4_vision_weights(seed: int = 3) -> dict[str, np.ndarray]:
    """The vision encoder and embedder of a tiny Gemma 4, under transformers' names
    (bf16-representable values; the clip bounds are 0-d, as transformers' buffers)."""
    c = GEMMA4_VISION
    rng = np.random.default_rng(seed)
    d, f, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    text_hidden = CONFIGS["gemma4_text"]["hidden_size"]
    m = "model.vision_tower."

    def norm(size: int) -> np.ndarray:  # Gemma4RMSNorm multiplies by w
        return 1 + 0.1 * rng.normal(size=size)

    w: dict[str, np.ndarray] = {
        m + "patch_embedder.input_proj.weight": rng.normal(0, 0.15, (d, 3 * c["patch_size"] ** 2)),
        m + "patch_embedder.position_embedding_table": rng.normal(
            0, 0.5, (2, c["position_embedding_size"], d)
        ),
        m + "std_bias": rng.normal(0, 0.5, d),
        m + "std_scale": rng.uniform(0.5, 1.5, d),
        "model.embed_vision.embedding_projection.weight": rng.normal(0, 0.2, (text_hidden, d)),
    }
    for i in range(c["num_hidden_layers"]):
        b = f"{m}encoder.layers.{i}."
        for name in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            w[f"{b}{name}_layernorm.weight"] = norm(d)
        w[b + "self_attn.q_norm.weight"] = norm(hd)
        w[b + "self_attn.k_norm.weight"] = norm(hd)
        shapes = {
            "self_attn.q_proj": (q, d),
            "self_attn.k_proj": (kv, d),
            "self_attn.v_proj": (kv, d),
            "self_attn.o_proj": (d, q),
            "mlp.gate_proj": (f, d),
            "mlp.up_proj": (f, d),
            "mlp.down_proj": (d, f),
        }
        for module, shape in shapes.items():
            w[f"{b}{module}.linear.weight"] = rng.normal(0, 0.3, shape)
            # Bounds inside the activations' range, so clamping changes the result.
            w[f"{b}{module}.input_min"] = np.asarray(-1.5)
            w[f"{b}{module}.input_max"] = np.asarray(2.0)
            w[f"{b}{module}.output_min"] = np.asarray(-2.0)
            w[f"{b}{module}.output_max"] = np.asarray(1.5)
    return {k: bf16_round(x.astype(np.float32)).reshape(x.shape) for k, x in w.items()}


def write_gemma4_multimodal(path: Path, bidirectional: str | None = "vision") -> dict:
    """A tiny Gemma4ForConditionalGeneration directory: the gemma4_text weights as its language
    model (`model.language_model.*`), gemma4_vision_weights() as its vision half, no audio
    tower, the image processor's settings beside it. `bidirectional`: the text config's
    use_bidirectional_attention ("vision": an image's rows see the whole image on the sliding
    layers; None: causal, as the small released models). Returns the config."""
    return write_multimodal_checkpoint(
        path,
        "gemma4_text",
        {
            **multimodal_text_weights("gemma4_text", "model.language_model."),
            **gemma4_vision_weights(),
        },
        model_type="gemma4",
        architecture="Gemma4ForConditionalGeneration",
        vision_type="gemma4_vision",
        drop=(),
        vision_config=GEMMA4_VISION,
        extra={**GEMMA4_MULTIMODAL, "audio_config": None},
        text_update={"use_bidirectional_attention": bidirectional},
        preprocessor=GEMMA4_PREPROCESSOR,
    )


# llama.cpp's names for the SigLIP layer modules in an mmproj GGUF (its tensor_mapping.py).
_MMPROJ_LAYER_NAMES = {
    "layer_norm1": "ln1",
    "layer_norm2": "ln2",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "mlp.fc1": "ffn_up",
    "mlp.fc2": "ffn_down",
}


def mmproj_name(hf_name: str) -> str:
    """gemma3_vision_weights()'s name -> the name llama.cpp's converter gives it."""
    m = "vision_tower.vision_model."
    top = {
        m + "embeddings.patch_embedding.weight": "v.patch_embd.weight",
        m + "embeddings.patch_embedding.bias": "v.patch_embd.bias",
        m + "embeddings.position_embedding.weight": "v.position_embd.weight",
        m + "post_layernorm.weight": "v.post_ln.weight",
        m + "post_layernorm.bias": "v.post_ln.bias",
        "multi_modal_projector.mm_soft_emb_norm.weight": "mm.soft_emb_norm.weight",
        "multi_modal_projector.mm_input_projection_weight": "mm.input_projection.weight",
    }
    if hf_name in top:
        return top[hf_name]
    layer, rest = hf_name.removeprefix(m + "encoder.layers.").split(".", 1)
    module, suffix = rest.rsplit(".", 1)
    return f"v.blk.{layer}.{_MMPROJ_LAYER_NAMES[module]}.{suffix}"


def mmproj_writer(
    path: Path,
    outtype: str,
    projector: str,
    *,
    projection_dim: int,
    image_size: int,
    patch_size: int,
    hidden: int,
    ffn: int,
    blocks: int,
    heads: int,
) -> Any:
    """A GGUFWriter holding the vision keys every llama.cpp mmproj carries (as
    `convert_hf_to_gguf.py --mmproj` writes them; image mean and std 0.5), for the caller to
    add its projector's own keys and tensors, then `close_gguf`."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "clip")
    w.add_type("mmproj")
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[outtype])
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.projection_dim", projection_dim)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", hidden)
    w.add_uint32("clip.vision.feed_forward_length", ffn)
    w.add_uint32("clip.vision.block_count", blocks)
    w.add_uint32("clip.vision.attention.head_count", heads)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_string("clip.projector_type", projector)
    w.add_bool("clip.use_gelu", True)
    return w


def close_gguf(w: Any) -> None:
    """Writes a GGUFWriter's header, keys and tensors, and closes the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gemma3_mmproj(
    path: Path,
    outtype: str = "F32",
    vision: dict | None = None,
    text_hidden: int | None = None,
    tensors: dict[str, np.ndarray] | None = None,
) -> None:
    """gemma3_vision_weights() as llama.cpp's `convert_hf_to_gguf.py --mmproj --outtype
    f32|f16|q8_0` writes them for write_gemma3_multimodal's checkpoint (the same metadata keys,
    names and tensor types: checked against the converter's own output by hand, see
    tests/native/test_gemma3_mmproj.py): the soft-embedding norm stored as 1 + w, embeddings
    in F32, the input projection in F16 whatever the outtype, other 2-D weights in `outtype`.
    The 64 / 4 = 16-patch grid pools 4x4, llama.cpp's default, so no scale factor key.
    `vision`, `text_hidden` and `tensors` (gemma3_vision_weights of those sizes) write another
    shape the same way."""
    from gguf import GGMLQuantizationType, quantize

    c = vision or GEMMA3_VISION
    text_hidden = text_hidden or CONFIGS["gemma3_text"]["hidden_size"]
    w = mmproj_writer(
        path,
        outtype,
        "gemma3",
        projection_dim=text_hidden,
        image_size=c["image_size"],
        patch_size=c["patch_size"],
        hidden=c["hidden_size"],
        ffn=c["intermediate_size"],
        blocks=c["num_hidden_layers"],
        heads=c["num_attention_heads"],
    )
    w.add_float32("clip.vision.attention.layer_norm_epsilon", c["layer_norm_eps"])
    for name, x in (tensors if tensors is not None else gemma3_vision_weights()).items():
        gname = mmproj_name(name)
        if gname == "mm.soft_emb_norm.weight":
            x = x + 1  # Gemma3RMSNorm's (1 + w), folded in by the converter
        x = x.astype(np.float32)
        matrix = x.ndim == 2 and "_embd" not in gname
        # Rows that do not fill 32-value blocks stay F16 in a q8_0 file, as the converter does.
        if gname == "mm.input_projection.weight" or (
            matrix and (outtype == "F16" or (outtype == "Q8_0" and x.shape[-1] % 32))
        ):
            x = x.astype(np.float16)
        elif outtype == "Q8_0" and matrix:
            q8 = GGMLQuantizationType.Q8_0
            w.add_tensor(gname, quantize(x, q8), raw_dtype=q8)
            continue
        w.add_tensor(gname, x)
    close_gguf(w)


def write_safetensors(
    path: Path,
    tensors: dict[str, np.ndarray],
    dtype: str = "BF16",
    f32: frozenset[str] = frozenset(),
) -> None:
    """A bf16 (or `dtype` F32) safetensors file (the format is a JSON header then raw
    little-endian data); uint32 arrays are stored as U32, tensors named in `f32` as F32."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        if arr.dtype == np.uint32:
            data, dt = np.ascontiguousarray(arr).tobytes(), "U32"
        elif dtype == "F32" or name in f32:
            data, dt = np.ascontiguousarray(arr, dtype=np.float32).tobytes(), "F32"
        else:
            data, dt = _bf16_bits(arr).tobytes(), "BF16"
        header[name] = {
            "dtype": dt,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def write_checkpoint(directory: Path, arch: str, seed: int = 0) -> dict[str, np.ndarray]:
    """config.json + model.safetensors of `arch` in `directory`; returns the weights."""
    directory.mkdir(parents=True, exist_ok=True)
    w = weights(arch, seed)
    (directory / "config.json").write_text(json.dumps(CONFIGS[arch], indent=1))
    write_safetensors(directory / "model.safetensors", w)
    return w


def qwen3_5_moe_mtp_weights(seed: int = 1, config: dict | None = None) -> dict[str, np.ndarray]:
    """Random `mtp.*` tensors for the tiny Qwen3.5-MoE checkpoint, in the layout Qwen3.5's
    checkpoints ship their multi-token-prediction head: norms of the next token's embedding and
    of the model's hidden state, `fc` over their concatenation (embedding first), one
    full-attention decoder layer with a MoE block, and a final norm (the lm_head is the
    model's). Drawn from a generator of their own, so the model's weights stay those of
    `weights("qwen3_5_moe_text")`. `config`: another size of the architecture."""
    c = config or CONFIGS["qwen3_5_moe_text"]
    rng = np.random.default_rng(seed)
    h, nh, nkv, hd = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )
    e, f, fs = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]

    def norm(n: int) -> np.ndarray:  # stored w of (1 + w)
        return 0.1 * rng.normal(size=n)

    def mat(*shape: int, scale: float = 0.15) -> np.ndarray:
        return rng.normal(0, scale, shape)

    p, a, m = "mtp.layers.0.", "mtp.layers.0.self_attn.", "mtp.layers.0.mlp."
    w = {
        "mtp.pre_fc_norm_embedding.weight": norm(h),
        "mtp.pre_fc_norm_hidden.weight": norm(h),
        "mtp.fc.weight": mat(h, 2 * h, scale=0.12),
        "mtp.norm.weight": norm(h),
        p + "input_layernorm.weight": norm(h),
        p + "post_attention_layernorm.weight": norm(h),
        a + "q_proj.weight": mat(2 * nh * hd, h),
        a + "k_proj.weight": mat(nkv * hd, h),
        a + "v_proj.weight": mat(nkv * hd, h),
        a + "o_proj.weight": mat(h, nh * hd),
        a + "q_norm.weight": norm(hd),
        a + "k_norm.weight": norm(hd),
        m + "gate.weight": mat(e, h, scale=0.3),
        m + "experts.gate_up_proj": mat(e, 2 * f, h),
        m + "experts.down_proj": mat(e, h, f),
        m + "shared_expert.gate_proj.weight": mat(fs, h),
        m + "shared_expert.up_proj.weight": mat(fs, h),
        m + "shared_expert.down_proj.weight": mat(h, fs),
        m + "shared_expert_gate.weight": mat(1, h, scale=0.3),
    }
    return {k: bf16_round(x.astype(np.float32)) for k, x in w.items()}


def write_qwen3_5_moe_with_mtp(
    directory: Path,
    mtp: dict[str, np.ndarray] | None = None,
    model: dict[str, np.ndarray] | None = None,
    config: dict | None = None,
) -> dict[str, np.ndarray]:
    """The tiny Qwen3.5-MoE checkpoint with an MTP head (`mtp` replaces the random one,
    `model` the model's own tensors, `config` another size); config.json says `mtp_num_hidden_layers: 1`, as Qwen3.5's
    do. Returns all the tensors."""
    directory.mkdir(parents=True, exist_ok=True)
    c = config or CONFIGS["qwen3_5_moe_text"]
    w = {
        **(model if model is not None else weights("qwen3_5_moe_text", config=c)),
        **(mtp or qwen3_5_moe_mtp_weights(config=c)),
    }
    (directory / "config.json").write_text(json.dumps({**c, "mtp_num_hidden_layers": 1}, indent=1))
    write_safetensors(directory / "model.safetensors", w)
    return w


def mlx_quantize(
    w: dict[str, np.ndarray],
    bits: int,
    group_size: int,
    overrides: dict[str, tuple[int, int]] | None = None,
    nudge_scales: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Quantizes the weights as mlx-lm's `convert -q` does (mlx.core.quantize on the bf16
    weights of every Linear and Embedding whose input width is a multiple of the group size:
    all 2-D `.weight` tensors here; norms stay float). Returns the quantized checkpoint's
    tensors (X.weight uint32-packed, X.scales and X.biases bf16) and the float32 values they
    stand for (mx.dequantize of them, computed in float32). `overrides`: module -> (bits,
    group_size), as mlx-lm's quant_predicate gives some modules. `nudge_scales`: scales
    scaled by 1 + 2^-20, float32 values that float16 cannot hold (stored as F32)."""
    import mlx.core as mx

    quantized: dict[str, np.ndarray] = {}
    dequantized: dict[str, np.ndarray] = {}
    for name, x in w.items():
        module = name.removesuffix(".weight")
        b, g = (overrides or {}).get(module, (bits, group_size))
        matrix = x.ndim == 2 or (
            x.ndim == 3 and (".switch_mlp." in name or ".switch_glu." in name)
        )  # Linear, SwitchLinear
        if not matrix or not name.endswith(".weight") or x.shape[-1] % g:
            quantized[name] = dequantized[name] = x
            continue
        q, scales, biases = mx.quantize(mx.array(x).astype(mx.bfloat16), group_size=g, bits=b)
        s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
        if nudge_scales:
            s32 = s32 * (1 + 2**-20)
        quantized[name] = np.array(q)
        quantized[module + ".scales"] = np.array(s32)  # bf16 values, written as BF16
        quantized[module + ".biases"] = np.array(b32)
        dequantized[name] = np.array(mx.dequantize(q, s32, b32, group_size=g, bits=b)).astype(
            np.float32
        )
    return quantized, dequantized


def mlx_q4_1_blocks(x: np.ndarray) -> np.ndarray:
    """GGUF Q4_1 blocks (fp16 d, fp16 m, 16 bytes of nibbles q[i] | q[i + 16] << 4) holding
    exactly mlx.core.quantize's 4-bit groups of 32 of the bf16 weights: uint8 [rows, bytes]."""
    import mlx.core as mx

    q, scales, biases = mx.quantize(mx.array(x).astype(mx.bfloat16), group_size=32, bits=4)
    n, k = x.shape
    packed = np.array(q).view(np.uint8)  # element 2j in the low nibble of byte j
    nib = np.stack([packed & 15, packed >> 4], -1).reshape(n, k // 32, 32)
    qs = (nib[..., :16] | (nib[..., 16:] << 4)).astype(np.uint8)
    d = np.array(scales.astype(mx.float32)).astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    m = np.array(biases.astype(mx.float32)).astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    return np.concatenate([d, m, qs], -1).reshape(n, k // 32 * 20)


def _write_quantized_pair(
    directory: Path,
    dequantized_directory: Path,
    config: dict,
    quantized: dict[str, np.ndarray],
    dequantized: dict[str, np.ndarray],
    bits: int,
    group_size: int,
    overrides: dict[str, tuple[int, int]] | None = None,
    f32: frozenset[str] = frozenset(),
) -> None:
    """The MLX-quantized checkpoint (config with mlx-lm's `quantization` and
    `quantization_config`, per-module `overrides` listed in them) and the float32 checkpoint of
    the values it dequantizes to, side by side."""
    for d in (directory, dequantized_directory):
        d.mkdir(parents=True, exist_ok=True)
    (dequantized_directory / "config.json").write_text(json.dumps(config, indent=1))
    write_safetensors(dequantized_directory / "model.safetensors", dequantized, dtype="F32")
    quant: dict = {"group_size": group_size, "bits": bits}
    for module, (b, g) in (overrides or {}).items():
        quant[module] = {"group_size": g, "bits": b}
    (directory / "config.json").write_text(
        json.dumps({**config, "quantization": quant, "quantization_config": quant}, indent=1)
    )
    write_safetensors(directory / "model.safetensors", quantized, f32=f32)


def write_mlx_quantized_checkpoint(
    directory: Path,
    dequantized_directory: Path,
    arch: str,
    bits: int = 4,
    group_size: int = 64,
    seed: int = 0,
    config: dict | None = None,
    overrides: dict[str, tuple[int, int]] | None = None,
    nudge_scales: bool = False,
) -> None:
    """An MLX-quantized checkpoint of `arch` as mlx-lm writes it (config with `quantization`
    and `quantization_config`, per-module `overrides` listed in them), and beside it the
    float32 checkpoint of the values it dequantizes to (the reference)."""
    c = dict(config or CONFIGS[arch])
    quantized, dequantized = mlx_quantize(
        weights(arch, seed, c), bits, group_size, overrides, nudge_scales
    )
    scales = frozenset(k for k in quantized if k.endswith((".scales", ".biases")))
    _write_quantized_pair(
        directory,
        dequantized_directory,
        c,
        quantized,
        dequantized,
        bits,
        group_size,
        overrides,
        f32=scales if nudge_scales else frozenset(),
    )


def _split_experts(out: dict[str, np.ndarray], key: str, x: np.ndarray, switch: str) -> bool:
    """mlx-lm's sanitize of stacked experts: `...experts.gate_up_proj` [E, 2F, D] as
    `...{switch}gate_proj.weight` and `up_proj.weight` (its halves), `...experts.down_proj` as
    `...{switch}down_proj.weight`, into `out`. False (nothing written) for any other tensor."""
    if key.endswith("experts.gate_up_proj"):
        sw = key.removesuffix("experts.gate_up_proj") + switch
        mid = x.shape[1] // 2
        out[sw + "gate_proj.weight"], out[sw + "up_proj.weight"] = x[:, :mid], x[:, mid:]
        return True
    if key.endswith("experts.down_proj"):
        out[key.removesuffix("experts.down_proj") + switch + "down_proj.weight"] = x
        return True
    return False


def _join_experts(
    out: dict[str, np.ndarray], dq: dict[str, np.ndarray], key: str, name: str, switch: str
) -> bool:
    """The inverse of _split_experts on the dequantized tensors `dq`: tensor `key` (named `name`
    in the Hugging Face layout) back as `...experts.gate_up_proj` / `down_proj` in `out`. False
    (nothing written) when it is not a `switch` tensor."""
    if switch not in name:
        return False
    base = name.split(switch)[0] + "experts."
    if "gate_proj" in name:
        out[base + "gate_up_proj"] = np.concatenate(
            [dq[key], dq[key.replace("gate_proj", "up_proj")]], 1
        )
    elif "down_proj" in name:
        out[base + "down_proj"] = dq[key]
    return True


_QWEN3_5_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def write_mlx_lm_qwen3_5_moe(
    directory: Path, dequantized_directory: Path, bits: int = 4, group_size: int = 32, seed: int = 0
) -> None:
    """The tiny Qwen3.5-MoE as mlx-lm saves it (models/qwen3_5_moe.py and qwen3_5.py
    sanitize: `language_model.` prefix, experts as switch_mlp.{gate,up,down}_proj, conv1d
    weights [C, K, 1], the decoder norms stored as 1 + w; quantized with the router and shared
    expert gate at 8 bits, groups of 64, as its quant_predicate says), and beside it the Hugging
    Face layout float32 checkpoint of the values it dequantizes to."""
    arch = "qwen3_5_moe_text"
    c = CONFIGS[arch]
    mlx: dict[str, np.ndarray] = {}
    for name, x in weights(arch, seed).items():
        key = "language_model." + name
        if _split_experts(mlx, key, x, "switch_mlp."):
            continue
        if name.endswith("conv1d.weight"):
            x = np.moveaxis(x, 2, 1)
        if name.endswith(_QWEN3_5_NORMS) and x.ndim == 1:
            x = bf16_round(x + 1)
        mlx[key] = x
    gates = {
        f"language_model.model.layers.{i}.mlp.{g}": (8, 64)
        for i in range(c["num_hidden_layers"])
        for g in ("gate", "shared_expert_gate")
    }
    quantized, dq = mlx_quantize(mlx, bits, group_size, gates)
    ref: dict[str, np.ndarray] = {}
    for key, x in dq.items():
        name = key.removeprefix("language_model.")
        if _join_experts(ref, dq, key, name, "switch_mlp."):
            continue
        if name.endswith("conv1d.weight"):
            x = np.moveaxis(x, 1, 2)
        if name.endswith(_QWEN3_5_NORMS) and x.ndim == 1:
            x = x - 1
        ref[name] = x
    _write_quantized_pair(
        directory, dequantized_directory, c, quantized, ref, bits, group_size, gates
    )


def write_mlx_lm_gemma4(
    directory: Path,
    dequantized_directory: Path,
    arch: str,
    bits: int = 4,
    group_size: int = 32,
    seed: int = 0,
) -> None:
    """A tiny Gemma 4 text model (`arch`: gemma4_text or gemma4_moe) as mlx-lm saves it
    (models/gemma4_text.py sanitize: KV-shared layers without k/v projections, experts as
    experts.switch_glu.{gate,up,down}_proj; quantized with router.proj at 8 bits, groups of 64,
    as its quant_predicate says), and beside it the Hugging Face layout float32 checkpoint of
    the values it dequantizes to."""
    c = CONFIGS[arch]
    first_shared = c["num_hidden_layers"] - c.get("num_kv_shared_layers", 0)
    mlx: dict[str, np.ndarray] = {}
    for name, x in weights(arch, seed).items():
        if any(s in name for s in (".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm")):
            if int(name.split("layers.")[1].split(".")[0]) >= first_shared:
                continue
        if not _split_experts(mlx, name, x, "experts.switch_glu."):
            mlx[name] = x
    routers = {
        f"model.layers.{i}.router.proj": (8, 64)
        for i in range(c["num_hidden_layers"])
        if f"model.layers.{i}.router.proj.weight" in mlx
    }
    quantized, dq = mlx_quantize(mlx, bits, group_size, routers)
    ref: dict[str, np.ndarray] = {}
    for name, x in dq.items():
        if not _join_experts(ref, dq, name, name, "experts.switch_glu."):
            ref[name] = x
    _write_quantized_pair(
        directory, dequantized_directory, c, quantized, ref, bits, group_size, routers
    )


# Hugging Face tensor names -> llama.cpp's (src/llama-arch.cpp), per layer.
_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}


def gguf_name(arch: str, hf_name: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    names = dict(_GGUF_LAYER_NAMES)
    if arch == "gemma3_text":  # sandwich norms
        names.update(
            post_attention_layernorm="post_attention_norm",
            pre_feedforward_layernorm="ffn_norm",
            post_feedforward_layernorm="post_ffw_norm",
        )
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    return f"blk.{layer}.{names[module]}.{suffix}"


def write_gguf(
    path: Path,
    arch: str,
    seed: int = 0,
    quant: str = "F32",
    config: dict | None = None,
    tensor_data: Callable[[str, np.ndarray], tuple[np.ndarray, Any] | None] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    extra_strings: dict[str, str] | None = None,
    extra_uints: dict[str, int] | None = None,
    vocabulary: dict[int, tuple[str, int]] | None = None,
) -> None:
    """The same weights as a GGUF with llama.cpp's names and metadata keys, as its converter
    writes them (Gemma's norms shifted by +1). `quant`: F32, F16 or Q8_0 for 2-D weights, or
    Q8_0-as-F32 (F32 tensors holding exactly the values a Q8_0 file would). `config` replaces
    CONFIGS[arch] (arch "llama" needs one); `tensor_data(gguf_name, values)` may return
    (data, raw GGMLQuantizationType or None for float data) to store a tensor its own way.
    `vocabulary` {id: (token, llama.cpp token type)} replaces those entries of the vocabulary
    (special tokens a test's template writes)."""
    from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, dequantize, quantize

    c = config or CONFIGS[arch]
    g = _GGUF_ARCH[arch]
    w = GGUFWriter(str(path), g)
    hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    if arch == "gemma3_text":
        w.add_sliding_window(c["sliding_window"])
        # Full-attention every 3rd layer (llama.cpp's default pattern is every 6th).
        w.add_uint32(f"{g}.attention.sliding_window_pattern", 3)
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c["rope_scaling"]["factor"])
        if c["final_logit_softcapping"] is not None:
            w.add_final_logit_softcapping(c["final_logit_softcapping"])
    # A byte-level BPE vocabulary of the model's size: llama.cpp loads no model without one.
    tokens = [f"<t{i}>" for i in range(c["vocab_size"])]
    tokens[3:7] = ["a", "b", "ab", "\u010a"]  # one merge, and the newline token it looks for
    types = [1] * len(tokens)
    for i, (token, kind) in (vocabulary or {}).items():
        tokens[i], types[i] = token, kind
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    for name, x in weights(arch, seed, config).items():
        if arch == "gemma3_text" and name.endswith("norm.weight"):
            x = x + 1  # Gemma3RMSNorm multiplies by (1 + w); llama.cpp stores 1 + w
        x = x.astype(np.float32)
        custom = tensor_data(gguf_name(arch, name), x) if tensor_data else None
        if custom is not None:
            data, raw_dtype = custom
            w.add_tensor(gguf_name(arch, name), data, raw_dtype=raw_dtype)
        elif quant == "Q8_0-as-F32" and x.ndim == 2:  # the values a Q8_0 file holds, as F32
            q8 = GGMLQuantizationType.Q8_0
            w.add_tensor(gguf_name(arch, name), dequantize(quantize(x, q8), q8).astype(np.float32))
        elif x.ndim == 1 or quant in ("F32", "Q8_0-as-F32"):
            w.add_tensor(gguf_name(arch, name), x)
        elif quant == "Q4_1-from-mlx":  # mlx-lm's 4-bit groups of 32 as the same Q4_1 blocks
            qt = GGMLQuantizationType.Q4_1
            w.add_tensor(gguf_name(arch, name), mlx_q4_1_blocks(x), raw_dtype=qt)
        elif quant == "F16":
            w.add_tensor(gguf_name(arch, name), x.astype(np.float16))
        else:
            qt = GGMLQuantizationType[quant]
            w.add_tensor(gguf_name(arch, name), quantize(x, qt), raw_dtype=qt)
    for name, x in (extra_tensors or {}).items():
        w.add_tensor(name, x)
    for key, value in (extra_strings or {}).items():
        w.add_string(key, value)
    for key, value in (extra_uints or {}).items():
        w.add_uint32(key, value)
    close_gguf(w)


def write_with_exact_twin(
    path: Path,
    twin: Path,
    arch: str,
    config: dict,
    blocks: Callable[[str, np.ndarray], tuple[np.ndarray, Any] | None],
) -> None:
    """`path` with each tensor `blocks(name, values)` returns stored as those (data, type), and
    `twin` with those tensors as F32 holding exactly what their blocks hold (gguf-py's
    dequantizer): the reference a quantized file's logits are compared with. Each tensor's
    blocks are made once, so random ones are the same in both files."""
    from gguf import dequantize

    made: dict[str, tuple[np.ndarray, Any] | None] = {}

    def quantized(name: str, x: np.ndarray) -> tuple[np.ndarray, Any] | None:
        if name not in made:
            made[name] = blocks(name, x)
        return made[name]

    def exact(name: str, x: np.ndarray) -> tuple[np.ndarray, None] | None:
        custom = quantized(name, x)
        if custom is None:
            return None
        data, qtype = custom
        return dequantize(np.ascontiguousarray(data), qtype).astype(np.float32).reshape(
            x.shape
        ), None

    write_gguf(path, arch, config=config, tensor_data=quantized)
    write_gguf(twin, arch, config=config, tensor_data=exact)


def loadable_llama_config(hidden: int = 64, ffn: int = 64) -> dict:
    """A one-layer llama of `hidden` x `ffn`: the smallest file the engine loads."""
    return {
        **CONFIGS["qwen3"],
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": 1,
        "rope_theta": 10000.0,
    }


def write_loadable_gguf(
    path: Path,
    *,
    quant: str = "Q8_0",
    payload: bytes = b"",
    pad_mb: int = 0,
    config: dict | None = None,
    tensor_data: Callable[[str, np.ndarray], tuple[np.ndarray, Any] | None] | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """A tiny llama GGUF the engine loads (pulls ask the engine's own loader before they
    install anything, so a store test's file must be a model). `payload` (stored as an extra
    F32 tensor the loader ignores) makes files with different digests; `pad_mb` MiB of zeros
    make a larger download."""
    extras: dict[str, np.ndarray] = {}
    if payload:
        raw = payload + b"\0" * (-len(payload) % 4)
        extras["llmd_test.payload"] = np.frombuffer(raw, dtype=np.float32).copy()
    if pad_mb:
        extras["llmd_test.pad"] = np.zeros(pad_mb << 18, dtype=np.float32)
    write_gguf(
        path,
        "llama",
        quant=quant,
        config=config or loadable_llama_config(),
        tensor_data=tensor_data,
        extra_tensors=extras,
        extra_strings=metadata,
    )
    return path


def write_stub_gguf(path: Path, arch: str) -> None:
    """A GGUF naming `arch` with one layer and a token table only: enough for a loader to
    decide, from the file alone, whether it runs that architecture."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 16), dtype=np.float32))
    close_gguf(w)


def tiny_engine(path: Path, kv_type: str, backend: str = "cpu", **options):  # type: ignore[no-untyped-def]
    """An engine over a tiny checkpoint with KV stored as `kv_type`, on `backend` ("mlx-cpu":
    the device path on MLX's CPU device): the small context and budget the KV storage tests
    compare types on, unless `options` say otherwise. Skips the test without a built engine."""
    import pytest

    from llmd.worker.host import hf_config

    native = pytest.importorskip(
        "llmd._engine", reason="the native engine (llmd._engine) is not built"
    )

    settings = {"context_length": 1024, "max_sequences": 8, "kv_budget_bytes": 16 << 20, **options}
    return native.Engine(
        str(path), backend=backend, hf_config=hf_config(str(path)), kv_type=kv_type, **settings
    )
