"""Q4_K / Q5_K / Q6_K models run the 8-row packed kernels on the hot path (issue 32).

A tiny llama in llama.cpp's Q4_K_M pattern (Q4_K throughout, attn_v and ffn_down in Q6_K in
layer 0, the tied embedding/head in Q6_K), with Q5_K_M's attn_v and ffn_down in layer 1, loaded
natively (not converted to Q8_0 as before Q5_K had kernels), is loaded once per x86 kernel path this CPU runs
(LLMD_CPU_PATH in a child process, since the path is chosen once per process). The engine
must report every K-quant projection as packed (":x8"), and give the logits of the same
model stored as F32 holding the dequantized values, within test_mixed_quant_types' Q8 bound.
With a vocabulary of 128 the tied head is packed too, and the embedding lookup reads its rows
back through unpack8_row; with 132 rows (not a multiple of the 8 rows the kernels tile) the
head stays row-major and says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from .conftest import on_kernel_path
from .test_mixed_quant_types import CONFIG, Q8_BOUND, _max_rel, _quantize
from .tiny_models import TOKENS, write_with_exact_twin

native = pytest.importorskip("llmd._engine")

X86_PATHS = [p for p in native.runnable_kernel_paths() if p in ("avx2", "avx512vnni")]


def _config(vocab: int) -> dict:
    return {**CONFIG["llama"], "vocab_size": vocab, "tie_word_embeddings": True}


def _type_of(name: str) -> str | None:
    if name == "token_embd.weight":
        return "Q6_K"
    if not name.startswith("blk.") or not name.endswith(".weight") or "norm" in name:
        return None
    _, layer, proj, _ = name.split(".")
    if proj not in ("attn_v", "ffn_down") or layer not in ("0", "1"):
        return "Q4_K"
    return "Q6_K" if layer == "0" else "Q5_K"


def _write_pair(tmp_path: Path, config: dict) -> tuple[Path, Path]:
    def quantized(name: str, x: np.ndarray):  # type: ignore[no-untyped-def]
        t = _type_of(name)
        return None if t is None else (_quantize(x, t), GGMLQuantizationType[t])

    paths = tmp_path / "k_m.gguf", tmp_path / "f32.gguf"
    write_with_exact_twin(*paths, "llama", config, quantized)
    return paths


def _run_on_path(model: Path, path: str) -> dict:
    code = (
        "import json; from llmd import _engine as e; "
        f"eng = e.Engine({str(model)!r}, context_length=256, max_sequences=4, backend='cpu', "
        "kv_budget_bytes=16 << 20); "
        f"print(json.dumps({{'active': e.active_kernel_path(), 'paths': eng.matmul_paths(), "
        f"'logits': eng.score({TOKENS!r}, 1).tolist()}}))"
    )
    return on_kernel_path(path, code)


@pytest.mark.skipif(not X86_PATHS, reason="no x86 kernel path runs here")
@pytest.mark.parametrize("vocab", [128, 132])
def test_q4_k_m_model_runs_packed_kernels_and_matches_the_dequantized_model(
    tmp_path: Path, vocab: int
) -> None:
    config = _config(vocab)
    q_path, f32_path = _write_pair(tmp_path, config)
    ref = native.Engine(
        str(f32_path), context_length=256, max_sequences=4, backend="cpu", kv_budget_bytes=16 << 20
    ).score(TOKENS, 1)[: len(TOKENS)]
    for path in X86_PATHS:
        got = _run_on_path(q_path, path)
        assert got["active"] == path
        paths = got["paths"]
        for layer in range(config["num_hidden_layers"]):
            for module in ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down"):
                runs = paths[f"blk.{layer}.{module}"].split("+")
                assert all(r.startswith(("llmd:q4_k:", "llmd:q5_k:", "llmd:q6_k:")) for r in runs)
                assert all(r.endswith(f":{path}:x8") for r in runs), paths
        assert paths["blk.0.ffn_down"] == f"llmd:q6_k:{path}:x8"
        assert paths["blk.1.ffn_down"] == f"llmd:q5_k:{path}:x8"
        assert paths["blk.1.attn_qkv"] == f"llmd:q4_k:{path}:x8+llmd:q5_k:{path}:x8"
        assert paths["output"] == f"llmd:q6_k:{path}" + (":x8" if vocab % 8 == 0 else ""), paths
        ours = np.array(got["logits"], dtype=np.float32)[: len(TOKENS)]
        assert _max_rel(ours, ref) < Q8_BOUND, (path, _max_rel(ours, ref))
        # Greedy choices agree wherever the reference's top two are further apart than the
        # bound lets logits move (random tiny models have near-ties; KV is float16 on both).
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * Q8_BOUND * float(np.max(np.abs(ref)))
        assert clear.sum() >= len(TOKENS) // 4
        assert (ours.argmax(1) == ref.argmax(1))[clear].all()


@pytest.mark.skipif("avx512vnni" not in X86_PATHS, reason="the AVX-512 path does not run here")
def test_a_long_prompt_in_one_step_gives_the_logits_of_small_steps(tmp_path: Path) -> None:
    """On the AVX-512 path a prompt of 48 tokens or more reaches the register-blocked K-quant
    kernels (kquant_zmm_blocked.h) in one prefill step, and steps of 8 tokens the 8-column
    kernels decode uses: every position's logits, and so the greedy choices, must not depend
    on which ran (the two give each row the same bits)."""
    q_path, _ = _write_pair(tmp_path, _config(128))
    tokens = (TOKENS * 5)[:96]
    code = (
        "import json; from llmd import _engine as e; "
        "run = lambda budget: e.Engine("
        f"{str(q_path)!r}, context_length=256, max_sequences=4, backend='cpu', "
        "kv_budget_bytes=16 << 20, step_token_budget=budget)"
        f".score({tokens!r}, 1).tolist(); "
        "print(json.dumps({'one': run(512), 'small': run(8)}))"
    )
    got = on_kernel_path("avx512vnni", code)
    one = np.array(got["one"], dtype=np.float32)
    small = np.array(got["small"], dtype=np.float32)
    assert one.shape == (len(tokens), 128)
    assert np.array_equal(one, small), np.abs(one - small).max()
