"""Encoder embedding models in the engine (native/mlx/bert.cpp): BERT, XLM-RoBERTa and
nomic-bert, from Hugging Face directories and from GGUF files, on the host kernels and on the
device graph (MLX's CPU device here), pool the vectors the reference computes on the same
weights (tests/fixtures/encoder_embeddings_reference.json, recorded by
tests/fixtures/record_encoder_embeddings.py); prompts run whole whatever the step budget, the
same alone or batched, and an encoder refuses to generate."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.native.tiny_encoder_models import (
    CONFIGS,
    write_encoder_dir,
    write_encoder_gguf,
    write_reranker_dir,
    write_reranker_gguf,
)

native = pytest.importorskip("llmd._engine")

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "encoder_embeddings_reference.json").read_text()
)
ARCHS = ("bert", "xlm-roberta", "nomic_bert")


def _engine(tmp_path: Path, arch: str, source: str, backend: str, **kw: Any) -> Any:
    from llmd.worker.host import hf_config

    if source == "gguf":
        path = tmp_path / f"{arch}.gguf"
        write_encoder_gguf(path, arch)
        return native.Engine(str(path), backend=backend, **kw)
    write_encoder_dir(tmp_path, arch)
    return native.Engine(str(tmp_path), hf_config=hf_config(str(tmp_path)), backend=backend, **kw)


def _drain(engine: Any, ids: set[str], timeout: float = 60) -> dict[str, dict]:
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while ids - set(out) and time.monotonic() < deadline:
        for ev in engine.poll(50):
            if ev["type"] in ("done", "error"):
                out[ev["id"]] = ev
    return out


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def _embed(engine: Any, prompts: list[list[int]], fx: dict, prefix: str = "e") -> list[dict]:
    ids = [f"{prefix}{i}" for i in range(len(prompts))]
    engine.submit_pooled(
        ids, prompts, output="embedding", pooling=fx["pooling"], normalize=fx["normalize"]
    )
    got = _drain(engine, set(ids))
    return [got[i] for i in ids]


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
@pytest.mark.parametrize("source", ["dir", "gguf"])
@pytest.mark.parametrize("arch", ARCHS)
def test_encoder_embeddings_match_the_reference(
    tmp_path: Path, arch: str, source: str, backend: str
) -> None:
    fx = FIXTURE[arch]
    engine = _engine(tmp_path, arch, source, backend, kv_type="f32")
    assert engine.info()["architecture"] in ("bert", "xlm-roberta", "nomic_bert", "nomic-bert")
    got = _embed(engine, [item["ids"] for item in fx["items"]], fx)
    for ev, item in zip(got, fx["items"], strict=True):
        assert ev["type"] == "done", ev
        assert len(ev["values"]) == len(item["embedding"])
        assert _cosine(ev["values"], item["embedding"]) >= 0.9999, (item["text"], backend, source)
        assert abs(np.linalg.norm(ev["values"]) - 1) < 1e-5
    engine.shutdown()


def test_whole_prompts_past_the_step_budget_alone_or_batched(tmp_path: Path) -> None:
    """A 42-token prompt under a 16-token step budget still runs whole (an encoder's early
    chunk would miss the later tokens), and each input's vector is the same in a batch of
    many as alone."""
    fx = FIXTURE["bert"]
    engine = _engine(
        tmp_path, "bert", "dir", "cpu", kv_type="f32", step_token_budget=16, max_sequences=8
    )
    prompts = [item["ids"] for item in fx["items"]] * 3
    batched = _embed(engine, prompts, fx, "b")
    for i, (ev, prompt) in enumerate(zip(batched, prompts, strict=True)):
        assert ev["type"] == "done" and ev["prompt_tokens"] == len(prompt)
        assert _cosine(ev["values"], fx["items"][i % len(fx["items"])]["embedding"]) >= 0.9999
        alone = _embed(engine, [prompt], fx, f"alone{i}-")[0]
        assert np.allclose(alone["values"], ev["values"], atol=1e-5)
    assert max(int(k) for k in engine.stats()["pooled_rows_histogram"]) > 1  # inputs shared steps
    engine.shutdown()


def test_an_encoder_refuses_to_generate_and_decoders_refuse_cls(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "bert", "dir", "cpu")
    engine.submit("g", [2, 10, 11, 3], max_tokens=4)
    ev = _drain(engine, {"g"})["g"]
    assert ev["type"] == "error" and ev["code"] == "unsupported"
    assert "encoder" in ev["message"]
    engine.shutdown()


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
@pytest.mark.parametrize("source", ["bert-gguf", "xlm-roberta-dir"])
def test_cross_encoder_scores_match_transformers(tmp_path: Path, source: str, backend: str) -> None:
    """A cross-encoder's classifier on the CLS row of each (query, document) pair gives
    transformers' sequence-classification logit (BERT's pair token types included)."""
    from llmd.worker.host import hf_config

    arch = source.rsplit("-", 1)[0]
    fx = FIXTURE[f"rerank_{arch}"]
    if source.endswith("gguf"):
        write_reranker_gguf(tmp_path / "r.gguf")
        engine = native.Engine(str(tmp_path / "r.gguf"), backend=backend, kv_type="f32")
    else:
        write_reranker_dir(tmp_path, arch)
        engine = native.Engine(str(tmp_path), hf_config=hf_config(str(tmp_path)), backend=backend)
    got = _embed(engine, [i["ids"] for i in fx["items"]], {"pooling": "cls", "normalize": False})
    for ev, item in zip(got, fx["items"], strict=True):
        assert ev["type"] == "done" and len(ev["values"]) == 1
        assert abs(1 / (1 + np.exp(-ev["values"][0])) - item["score"]) < 1e-4, item["document"]
    engine.shutdown()


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
@pytest.mark.parametrize("quant", ["F16", "Q8_0"])
@pytest.mark.parametrize("arch", ["bert", "nomic_bert"])
def test_quantized_gguf_files_embed_close_to_the_reference(
    tmp_path: Path, arch: str, quant: str, backend: str
) -> None:
    """Published encoder GGUFs store their matrices in F16 or Q8_0 (Q8_0 runs on llmd's CPU
    kernels as stored): the vectors stay within the quantization's error of the reference."""
    fx = FIXTURE[arch]
    write_encoder_gguf(tmp_path / "q.gguf", arch, quant=quant)
    engine = native.Engine(str(tmp_path / "q.gguf"), backend=backend, kv_type="f32")
    got = _embed(engine, [item["ids"] for item in fx["items"]], fx)
    floor = 0.9999 if quant == "F16" else 0.999
    for ev, item in zip(got, fx["items"], strict=True):
        assert ev["type"] == "done", ev
        assert _cosine(ev["values"], item["embedding"]) >= floor, (item["text"], quant, backend)
    if backend == "cpu" and quant == "Q8_0":  # llmd's kernels over the Q8_0 blocks
        assert engine.matmul_paths()["blk.0.ffn_down"].startswith("llmd:q8_0")
    engine.shutdown()


@pytest.mark.parametrize(
    ("arch", "hidden", "heads", "ffn"),
    [
        ("bert", 80, 5, 100),  # head_dim 16; 100 and 240 outputs: a part-filled GEMM panel
        ("bert", 72, 6, 90),  # head_dim 12: attention as MLX ops, the float GEMM still llmd's
        ("nomic_bert", 96, 3, 72),  # head_dim 32 with rotary positions in the attention op
    ],
)
def test_host_kernels_agree_with_mlx_ops_on_odd_shapes(
    tmp_path: Path, arch: str, hidden: int, heads: int, ffn: int
) -> None:
    """The host backend runs an encoder's float matmuls, attention (all inputs in one op),
    GELU and LayerNorms on llmd's own kernels (encoder_ops.h, float_gemm.h); the device graph
    runs MLX's ops. On shapes that leave partial vector tiles, heads the attention kernel
    does not take, and inputs of many lengths in one step, both give the same vectors."""
    c = dict(CONFIGS[arch])
    if arch == "nomic_bert":
        c.update(n_embd=hidden, n_head=heads, n_inner=ffn)
    else:
        c.update(hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn)
    write_encoder_gguf(tmp_path / "odd.gguf", arch, config=c)
    rng = np.random.default_rng(3)
    prompts = [[2, *rng.integers(5, 90, size=n).tolist(), 3] for n in (1, 5, 7, 13, 30, 61)]
    vectors = {}
    for backend in ("cpu", "mlx-cpu"):
        engine = native.Engine(str(tmp_path / "odd.gguf"), backend=backend, kv_type="f32")
        if backend == "cpu":
            assert engine.matmul_paths()["blk.0.ffn_down"] == "llmd:f32:gemm"
        got = _embed(engine, prompts, {"pooling": "mean", "normalize": False})
        assert all(ev["type"] == "done" for ev in got), got
        vectors[backend] = [ev["values"] for ev in got]
        engine.shutdown()
    for a, b in zip(vectors["cpu"], vectors["mlx-cpu"], strict=True):
        assert _cosine(a, b) >= 0.99999
        assert np.allclose(a, b, rtol=1e-3, atol=1e-4)


XLMR = json.loads((Path(__file__).parents[1] / "fixtures" / "xlmr_gguf_reference.json").read_text())


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_xlm_roberta_gguf_files_from_llamacpps_converter(backend: str) -> None:
    """BGE-M3-style and bge-reranker-v2-m3-style files as convert_hf_to_gguf.py writes them
    (position rows before padding_idx + 1 dropped, a one-label head as cls / cls.output, no
    token types): sentence-transformers' embeddings and CrossEncoder scores
    (tests/fixtures/record_xlmr_gguf.py)."""
    fixtures = Path(__file__).parents[1] / "fixtures"
    fx = XLMR["embed"]
    engine = native.Engine(str(fixtures / "xlmr_unigram_embed.gguf"), backend=backend)
    got = _embed(engine, [item["ids"] for item in fx["items"]], fx)
    for ev, item in zip(got, fx["items"], strict=True):
        assert ev["type"] == "done", ev
        assert _cosine(ev["values"], item["embedding"]) >= 0.9999, (item["text"], backend)
    engine.shutdown()
    engine = native.Engine(str(fixtures / "xlmr_unigram_rerank.gguf"), backend=backend)
    items = XLMR["rerank"]["items"]
    got = _embed(engine, [i["ids"] for i in items], {"pooling": "cls", "normalize": False})
    for ev, item in zip(got, items, strict=True):
        assert ev["type"] == "done" and len(ev["values"]) == 1
        assert abs(1 / (1 + np.exp(-ev["values"][0])) - item["score"]) < 1e-4, item["document"]
    engine.shutdown()
