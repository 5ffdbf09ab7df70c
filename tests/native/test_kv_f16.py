"""The CPU backend keeps its KV cache in float16 (issue 32, item 4), as llama.cpp does.

What a user notices: the same KV budget holds twice the context it held in float32 (bytes per
position halve), while attention stays as accurate as float16 storage allows. The kernel
checks build KV in the pool's own block layout through the write path's conversion and
compare every attention variant this CPU runs (the one each LLMD_CPU_PATH selects) with a
float64 reference; parity with llama.cpp on the real model is test_parity_llamacpp's job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import on_kernel_path, run_all
from .kernel_checks import attention_case, attention_reference
from .tiny_models import tiny_engine

native = pytest.importorskip("llmd._engine")
PATHS = native.runnable_kernel_paths()

# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, keys and values.
SMOLLM2_KV_ELEMENTS_PER_TOKEN = 30 * 3 * 64 * 2
HALF_EPS = 2.0**-11  # float16's relative rounding error (round to nearest)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n,head_dim", [(65, 64), (300, 64), (1100, 128)])
def test_attention_over_f16_kv_matches_float64attention_reference(
    path: str, n: int, head_dim: int
) -> None:
    q, k, v, n_pos, first_pos = attention_case(n + head_dim, n, head_dim)
    out = native.kernel_attention(q, k, v, n_pos, first_pos, "f16", path)
    # The kernel against the same float16 keys and values in float64: only float32
    # accumulation and the polynomial exp differ (relative 1e-6 of the largest value, x4).
    stored = attention_reference(q, k.astype(np.float16), v.astype(np.float16), n_pos, first_pos)
    vmax = np.abs(v).max()
    assert np.abs(out - stored).max() <= 4e-6 * vmax, path
    # Against float32 KV: storing in float16 moves a value by at most |v| * 2^-11 and a score
    # by delta = sum_d |q_d k_d| * 2^-11, which changes softmax weights by at most a factor
    # e^(2 delta): the output moves by at most vmax * (2^-11 + e^(2 delta) - 1).
    exact = attention_reference(q, k, v, n_pos, first_pos)
    delta = (np.abs(q) @ np.abs(k).T).max() * HALF_EPS
    bound = vmax * (HALF_EPS + np.expm1(2 * delta)) + 4e-6 * vmax
    assert np.abs(out - exact).max() <= bound, path


@pytest.mark.parametrize("path", PATHS)
def test_f16_attention_rows_do_not_depend_on_their_tile(path: str) -> None:
    """Isolation: a query gives the same bits alone or tiled with others (decode heads of a
    KV group and prefill rows share tiles)."""
    q, k, v, n_pos, first_pos = attention_case(5, 200, 64)
    tiled = native.kernel_attention(q, k, v, n_pos, first_pos, "f16", path, 4)
    alone = native.kernel_attention(q, k, v, n_pos, first_pos, "f16", path, 1)
    assert np.array_equal(tiled, alone), path


def test_each_kernel_path_selects_its_own_attention_variant() -> None:
    expected = {"avx512vnni": "avx512", "avx2": "avx2"}
    for path in PATHS:
        assert native.attention_kernel_path(path) == expected.get(path, "generic")


def test_kv_budget_holds_twice_the_context_of_float32(model_path: Path) -> None:
    """A budget of four float32 blocks (256 positions) holds eight float16 blocks: a
    400-token prompt that float32 KV could not hold runs to completion."""
    f32_bytes_per_token = SMOLLM2_KV_ELEMENTS_PER_TOKEN * 4
    budget = 4 * 64 * f32_bytes_per_token
    engine = native.Engine(
        str(model_path), context_length=2048, kv_budget_bytes=budget, backend="cpu"
    )
    kv = engine.kv_cache()
    assert kv["type"] == "f16"
    assert kv["bytes_per_token"] == SMOLLM2_KV_ELEMENTS_PER_TOKEN * 2
    assert kv["capacity_tokens"] == 8 * 64
    assert kv["attention"] == f"llmd:f16:{native.attention_kernel_path('')}"
    prompt = [(i * 37) % 5000 + 10 for i in range(400)]
    result = run_all(engine, {"long": {"prompt": prompt, "max_tokens": 8}})["long"]
    assert result["done"] is not None and result["done"]["finish_reason"] == "length", result
    assert engine.stats()["kv_bytes"] <= budget


@pytest.mark.parametrize("path", [p for p in PATHS if p in ("avx2", "scalar")])
def test_forced_kernel_path_runs_its_attention_variant(model_path: Path, path: str) -> None:
    """LLMD_CPU_PATH forces attention down with the matmuls, and the engine says so."""
    code = (
        "import json, llmd._engine as e;"
        f"eng = e.Engine({str(model_path)!r}, context_length=512, backend='cpu');"
        "print(json.dumps([eng.info()['attention'], eng.kv_cache()['attention']]))"
    )
    expected = f"llmd:f16:{native.attention_kernel_path(path)}"
    assert on_kernel_path(path, code, timeout=120) == [expected, expected]


def test_worker_ready_reports_kv_type_and_attention_path(model_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmd.worker",
            "--model",
            str(model_path),
            "--kv-budget",
            str(1 << 26),
        ],
        input=b'{"type":"shutdown"}\n',
        capture_output=True,
        timeout=120,
    )
    ready = json.loads(proc.stdout.splitlines()[0])
    assert ready["type"] == "ready", ready
    assert ready["kv_type"] == "f16"
    assert ready["kv_bytes_per_token"] == SMOLLM2_KV_ELEMENTS_PER_TOKEN * 2
    assert ready["kv_capacity_tokens"] == (1 << 26) // (64 * ready["kv_bytes_per_token"]) * 64
    assert ready["kernels"]["attention"].startswith("llmd:f16:")


F16_ARCHS = ["gemma3_text", "gemma4_text", "qwen3_5_moe_text"]  # windows, KV groups, hybrid


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from .tiny_models import write_checkpoint

    root = tmp_path_factory.mktemp("tiny_f16")
    for arch in F16_ARCHS:
        write_checkpoint(root / arch, arch)
    return {arch: root / arch for arch in F16_ARCHS}


@pytest.mark.parametrize("arch", F16_ARCHS)
def test_f16_kv_on_sliding_window_and_hybrid_models(tiny_checkpoints, arch: str) -> None:  # type: ignore[no-untyped-def]
    """Sliding-window parts, KV groups of different shapes and hybrid recurrent models run on
    float16 KV: logits stay near the float32-KV engine's (the only difference is KV rounding;
    the tiny random models' sharp attention makes it up to ~4% of the logit scale, bound 1e-1),
    and interleaved sequences stay bit-identical to the same sequences run alone (no bleed)."""
    from .tiny_models import LONG_TOKENS, TOKENS

    f16 = tiny_engine(tiny_checkpoints[arch], "f16")
    f32 = tiny_engine(tiny_checkpoints[arch], "f32")
    assert f16.kv_cache()["type"] == "f16" and f32.kv_cache()["type"] == "f32"
    assert f16.kv_cache()["bytes_per_token"] * 2 == f32.kv_cache()["bytes_per_token"]
    a, b = f16.score(TOKENS, 1), f32.score(TOKENS, 1)
    assert np.abs(a - b).max() <= 1e-1 * np.abs(b).max()
    requests = {
        "long": {"prompt": LONG_TOKENS, "max_tokens": 24},
        "short": {"prompt": TOKENS, "max_tokens": 24},
        "other": {"prompt": LONG_TOKENS[::-1][:150], "max_tokens": 24},
    }
    together = run_all(f16, requests)
    for rid, r in requests.items():
        alone = run_all(tiny_engine(tiny_checkpoints[arch], "f16"), {rid: r})
        assert alone[rid]["tokens"] == together[rid]["tokens"], (arch, rid)
