"""The dense Qwen3.5 (`qwen3_5_text` / `qwen3_5` configs, GGUF `qwen35`): Qwen3.5-MoE's hybrid
layers (Gated DeltaNet and gated full attention, M-RoPE) with a SwiGLU MLP in every layer, run
by native/mlx/qwen3_5_moe.cpp, against transformers' Qwen3_5ForCausalLM on the tiny random
checkpoint (tests/fixtures/qwen3_5_text_transformers.json, record_transformers.py) from its
safetensors and from the GGUF llama.cpp's converter writes for it (tiny_qwen35_gguf: equal to
the converter's recorded output, `--no-mtp`; the dense tiny checkpoint has no MTP head).

Tolerance as test_qwen3_5_moe.py: 1e-4 of the largest |logit| (float32 on both sides).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_qwen3_5_gguf import _compare, assert_matches_transformers
from .tiny_models import write_checkpoint
from .tiny_qwen35_gguf import digest, write_qwen35moe_gguf

native = pytest.importorskip("llmd._engine")

ARCH = "qwen3_5_text"
FIXTURES = Path(__file__).parents[1] / "fixtures"
FIXTURE = FIXTURES / f"{ARCH}_transformers.json"
BACKENDS = ["cpu", "mlx-cpu"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("qwen3_5_dense")
    write_checkpoint(d / "hf", ARCH)
    return {"hf": d / "hf", "gguf": write_qwen35moe_gguf(d / "tiny-qwen3.5-dense.gguf", dense=True)}


def _engine(path: Path, backend: str):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    config = hf_config(str(path)) if path.is_dir() else {}
    return native.Engine(
        str(path), backend=backend, hf_config=config, context_length=256, kv_type="f32"
    )


def test_gguf_writer_writes_what_the_converter_writes(tmp_path: Path) -> None:
    recorded = json.loads((FIXTURES / "qwen3_5_gguf_llamacpp.json").read_text())["dense_text"]
    _compare(digest(write_qwen35moe_gguf(tmp_path / "dense.gguf", dense=True)), recorded)


@pytest.mark.parametrize("form", ["hf", "gguf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_and_greedy_tokens_match_transformers(
    models: dict[str, Path], backend: str, form: str
) -> None:
    engine = _engine(models[form], backend)
    info = engine.info()
    assert info["architecture"] == "qwen3_5"
    assert not engine.has_mtp
    prefill, worst, scale = assert_matches_transformers(engine, FIXTURE)
    print(f"\n{form} {backend}: prefill {prefill:.2e}, greedy {worst:.2e} (scale {scale:.2f})")


def test_the_mlp_is_dense(models: dict[str, Path]) -> None:
    paths = _engine(models["gguf"], "cpu").matmul_paths()
    assert "blk.0.ffn_gate_up" in paths and "blk.0.ffn_down" in paths
    assert not any("exps" in k for k in paths)


def test_pull_accepts_the_architectures(models: dict[str, Path]) -> None:
    from llmd.store.engine_check import engine_refusal
    from llmd.store.install import check_hf_config
    from llmd.store.model_support import gguf_architecture_supported

    assert gguf_architecture_supported("qwen35")
    assert engine_refusal(models["gguf"]) is None
    config = json.loads((models["hf"] / "config.json").read_text())
    assert check_hf_config(config, "test") == "qwen3_5_text"
