"""GGUF files whose fused projections mix block types load and run (issue 32).

llama.cpp's Q4_K_M recipe stores attn_v (and ffn_down) in Q6_K in about half the layers while
attn_q/attn_k stay Q4_K; other recipes mix further. llmd fuses q|k|v and gate|up into one
Linear each; parts of different types become one Linear per run of same-typed parts
(matmul_paths reports the runs joined by '+'), and parts of one type keep the single fused
kernel.

Reference: the same model with every weight stored as F32 holding exactly the values the
mixed file's blocks dequantize to (gguf's own dequantizer). llmd's CPU kernels quantize
activations to int8 blocks and the device backend re-quantizes Q6_K to 8-bit affine groups,
so the bound is test_architectures' Q8 bound, 8e-2 of the largest |logit|. Measured (AVX-512
VNNI): 2.8% (llama) and 4.0% (gemma3) on the CPU kernels, the same as files of one type
(Q4_K or Q6_K throughout); 1.2% and 2.2% on the device graph. Gate and up swapped in one
layer moves the logits by 72% and 92%.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from .kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from .tiny_models import CONFIGS, TOKENS, write_with_exact_twin

native = pytest.importorskip("llmd._engine")

BACKENDS = ["cpu", "mlx-cpu"]
Q8_BOUND = 8e-2

# K-quants need rows of a multiple of 256 weights.
_SIZES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 3,
    "tie_word_embeddings": False,
}
CONFIG = {
    "llama": {
        **CONFIGS["qwen3"],
        **_SIZES,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "rope_theta": 10000.0,
    },
    "gemma3_text": {**CONFIGS["gemma3_text"], **_SIZES},
}

# Per layer, the block type of each projection (anything unlisted: Q4_K).
LAYER_TYPES = {
    # Q4_K_M's pattern: q|k fused, v apart; Q5_0 and Q5_1 are what llama.cpp's K-quant recipes
    # write for rows that are no multiple of 256 (in place of Q4_K and Q5_K).
    0: {"attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_output": "Q5_0"},
    # gate and up apart, q|k|v one kernel
    1: {"ffn_gate": "Q5_1", "ffn_up": "Q6_K", "ffn_down": "Q5_K"},
    2: {"attn_q": "Q5_K", "attn_k": "Q8_0", "attn_v": "Q6_K", "ffn_gate": "Q8_0", "ffn_up": "Q4_0"},
}
TOP_TYPES = {"token_embd.weight": "Q4_K", "output.weight": "Q6_K"}


def _type_of(name: str) -> str | None:
    if name in TOP_TYPES:
        return TOP_TYPES[name]
    if not name.startswith("blk.") or not name.endswith(".weight") or "norm" in name:
        return None
    _, layer, proj, _ = name.split(".")
    return LAYER_TYPES[int(layer)].get(proj, "Q4_K")


def _quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    # Weights of std 0.15 over 64 inputs in tiny_models; half that over 256 keeps the
    # activations (and so the int8 activation rounding's effect) on the same scale.
    x = x * 0.5
    if type_name == "Q4_K":
        return quantize_q4_k(x)[0]
    if type_name == "Q5_K":
        return quantize_q5_k(x)[0]
    if type_name == "Q6_K":
        return quantize_q6_k(x)[0]
    return quantize(x, GGMLQuantizationType[type_name])


def _write_pair(tmp_path: Path, arch: str) -> tuple[Path, Path]:
    """The mixed-type GGUF and its F32 twin (the mixed file's dequantized values)."""

    def mixed(name: str, x: np.ndarray):  # type: ignore[no-untyped-def]
        t = _type_of(name)
        return None if t is None else (_quantize(x, t), GGMLQuantizationType[t])

    paths = tmp_path / f"{arch}-mixed.gguf", tmp_path / f"{arch}-f32.gguf"
    write_with_exact_twin(*paths, arch, CONFIG[arch], mixed)
    return paths


def _engine(path: Path, backend: str):  # type: ignore[no-untyped-def]
    return native.Engine(
        str(path), context_length=256, max_sequences=4, backend=backend, kv_budget_bytes=16 << 20
    )


def _max_rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", list(CONFIG))
def test_mixed_types_give_the_dequantized_models_logits(
    tmp_path: Path, arch: str, backend: str
) -> None:
    mixed_path, f32_path = _write_pair(tmp_path, arch)
    engine = _engine(mixed_path, backend)
    ours = engine.score(TOKENS, 1)[: len(TOKENS)]
    ref = _engine(f32_path, backend).score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(ours, ref) < Q8_BOUND, _max_rel(ours, ref)
    # Prefill in one chunk runs the same pieces with many rows.
    chunked = engine.score(TOKENS, 12)[: len(TOKENS) - 11]
    assert _max_rel(chunked, ref[11:]) < Q8_BOUND
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_paths_show_the_runs_and_keep_fused_kernels(tmp_path: Path, backend: str) -> None:
    mixed_path, _ = _write_pair(tmp_path, "llama")
    paths = _engine(mixed_path, backend).matmul_paths()

    def runs(key: str) -> list[str]:
        return paths[key].split("+")

    def kind(path: str) -> str:  # "q4_k" of "llmd:q4_k:avx2:x8" or "mlx:qmm:q4_k->affine4:cpu"
        return path.split(":")[1 if backend == "cpu" else 2].split("->")[0]

    assert [kind(p) for p in runs("blk.0.attn_qkv")] == ["q4_k", "q6_k"]
    assert [kind(p) for p in runs("blk.0.ffn_gate_up")] == ["q4_k"]  # still one fused kernel
    assert [kind(p) for p in runs("blk.1.attn_qkv")] == ["q4_k"]
    assert [kind(p) for p in runs("blk.1.ffn_gate_up")] == ["q5_1", "q6_k"]
    assert [kind(p) for p in runs("blk.0.attn_output")] == ["q5_0"]
    assert [kind(p) for p in runs("blk.1.ffn_down")] == ["q5_k"]
    assert [kind(p) for p in runs("blk.2.attn_qkv")] == ["q5_k", "q8_0", "q6_k"]
    assert [kind(p) for p in runs("blk.2.ffn_gate_up")] == ["q8_0", "q4_0"]
    if backend == "cpu":
        assert all(p.startswith("llmd:q") for v in paths.values() for p in v.split("+")), paths
