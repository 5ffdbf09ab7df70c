"""A Hugging Face llama checkpoint (safetensors, bf16) loads and matches an independent numpy
forward pass written from the architecture's definition (rotate-half RoPE, GQA, SwiGLU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
native = pytest.importorskip("llmd._engine")

CFG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
    "vocab_size": 128,
    "tie_word_embeddings": False,
}


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, f, hd = CFG["hidden_size"], CFG["intermediate_size"], CFG["head_dim"]
    nh, nkv, v = CFG["num_attention_heads"], CFG["num_key_value_heads"], CFG["vocab_size"]
    w = {
        "model.embed_tokens.weight": rng.normal(0, 1, (v, h)),
        "model.norm.weight": 1 + 0.1 * rng.normal(size=h),
        "lm_head.weight": rng.normal(0, 0.2, (v, h)),
    }
    for i in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=h)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=h)
        w[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.15, (nh * hd, h))
        w[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.15, (nkv * hd, h))
        w[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.15, (nkv * hd, h))
        w[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.15, (h, nh * hd))
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.15, (f, h))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.15, (f, h))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.15, (h, f))
    # Round through bf16 so the reference sees exactly the stored values.
    return {
        k: np.array(mx.array(v.astype(np.float32)).astype(mx.bfloat16).astype(mx.float32))
        for k, v in w.items()
    }


def _reference_logits(w: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    h, hd = CFG["hidden_size"], CFG["head_dim"]
    nh, nkv = CFG["num_attention_heads"], CFG["num_key_value_heads"]
    x = w["model.embed_tokens.weight"][tokens].astype(np.float64)
    n = len(tokens)
    inv = CFG["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rms(v: np.ndarray, g: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + CFG["rms_norm_eps"]) * g

    def rope(t: np.ndarray) -> np.ndarray:  # [n, heads, hd], rotate-half
        rot = np.concatenate([-t[..., hd // 2 :], t[..., : hd // 2]], -1)
        return t * cos[:, None, :] + rot * sin[:, None, :]

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = rope((a @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nh, hd))
        k = rope((a @ w[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, hd))
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, hd)
        out = np.zeros((n, nh, hd))
        for head in range(nh):
            g = head // (nh // nkv)
            s = q[:, head] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(n, h) @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        x = (
            x
            + (gate / (1 + np.exp(-gate)) * (m @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_tiny_hf_llama_matches_numpy_reference(tmp_path: Path) -> None:
    w = _weights(np.random.default_rng(0))
    mx.save_safetensors(
        str(tmp_path / "model.safetensors"),
        {k: mx.array(v).astype(mx.bfloat16) for k, v in w.items()},
    )
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    from llmd.worker.host import hf_config

    engine = native.Engine(str(tmp_path), context_length=128, hf_config=hf_config(str(tmp_path)))
    tokens = [3, 17, 99, 5, 64, 2, 120, 33, 8, 71]
    ours = engine.score(tokens, 1)[: len(tokens)]
    ref = _reference_logits(w, tokens)
    assert np.abs(ours - ref).max() < 2e-3 * np.abs(ref).max()
    assert (ours.argmax(1) == ref.argmax(1)).all()
    assert engine.info()["weight_format"] == "safetensors"
    assert all(p == "mlx:matmul:f32" for p in engine.matmul_paths().values())
