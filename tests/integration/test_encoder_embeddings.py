"""Encoder embedding models through `llmd serve`, as a user reaches them: tiny random BERT
(CLS pooling, BGE-style), XLM-RoBERTa (mean) and nomic-bert (rotary, SwiGLU, mean) models
(tests/native/tiny_encoder_models.py) pulled from local sentence-transformers directories and
from GGUF files, then asked through the official `openai` and `ollama` clients, on llmd's CPU
kernels and on the device graph (LLMD_BACKEND=mlx-cpu). Vectors are compared with the reference
on the same weights (tests/fixtures/encoder_embeddings_reference.json, recorded by
tests/fixtures/record_encoder_embeddings.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import LiveServer, run_llmd, short_home, start_server, stop_server
from tests.native.tiny_encoder_models import (
    write_encoder_dir,
    write_encoder_gguf,
    write_reranker_dir,
    write_reranker_gguf,
)

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "encoder_embeddings_reference.json").read_text()
)
ARCHS = ("bert", "xlm-roberta", "nomic_bert")


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


@pytest.fixture(scope="module", params=["cpu", "mlx-cpu"])
def encoders(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """A daemon on `backend` with every tiny encoder pulled: `<arch>` from its directory and
    `<arch>-gguf` from its GGUF."""
    previous = os.environ.get("LLMD_BACKEND")
    os.environ["LLMD_BACKEND"] = request.param
    home = short_home()
    try:
        live = start_server(home)
    finally:
        if previous is None:
            del os.environ["LLMD_BACKEND"]
        else:
            os.environ["LLMD_BACKEND"] = previous
    live.backend = request.param  # type: ignore[attr-defined]
    root = tmp_path_factory.mktemp("encoders")
    for arch in ARCHS:
        write_encoder_dir(root / arch, arch)
        write_encoder_gguf(root / f"{arch}.gguf", arch)
        for path, name in ((root / arch, arch), (root / f"{arch}.gguf", f"{arch}-gguf")):
            pulled = run_llmd(live.env, "pull", str(path), "--name", name, timeout=300)
            assert pulled.returncode == 0, pulled.stderr
    write_encoder_dir(root / "bert_dense", "bert", dense=True)
    write_encoder_dir(root / "nomic-mrl", "nomic_bert", card="Trained with Matryoshka loss.")
    write_reranker_dir(root / "tiny-xlmr-reranker", "xlm-roberta")
    write_reranker_gguf(root / "bert-reranker.gguf")
    for name in ("bert_dense", "nomic-mrl", "tiny-xlmr-reranker", "bert-reranker.gguf"):
        pulled = run_llmd(live.env, "pull", str(root / name), "--name", name, timeout=300)
        assert pulled.returncode == 0, pulled.stderr
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_openai_client_embeds_texts_like_the_reference(encoders: LiveServer, arch: str) -> None:
    fx = FIXTURE[arch]
    texts = [item["text"] for item in fx["items"]]
    client = OpenAI(base_url=encoders.base_url + "/v1", api_key="unused")
    out = client.embeddings.create(model=arch, input=texts)
    for got, item in zip(out.data, fx["items"], strict=True):
        assert _cosine(got.embedding, item["embedding"]) >= 0.9999, item["text"]
        assert abs(np.linalg.norm(got.embedding) - 1) < 1e-5
    assert out.usage.prompt_tokens == sum(len(item["ids"]) for item in fx["items"])


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_files_embed_like_the_reference(encoders: LiveServer, arch: str) -> None:
    """The GGUF twin of each model: through /api/embed with the ollama client. BERT's and
    nomic-bert's texts go through the WordPiece vocabulary llmd rebuilds from the GGUF; the
    XLM-RoBERTa test file's vocabulary is made up, so it is fed token ids on /v1/embeddings."""
    import ollama

    fx = FIXTURE[arch]
    if arch == "xlm-roberta":
        out = httpx.post(
            encoders.base_url + "/v1/embeddings",
            json={"model": f"{arch}-gguf", "input": [item["ids"] for item in fx["items"]]},
            timeout=120,
        )
        assert out.status_code == 200, out.text
        vectors = [d["embedding"] for d in out.json()["data"]]
    else:
        client = ollama.Client(host=encoders.base_url)
        embedded = client.embed(model=f"{arch}-gguf", input=[item["text"] for item in fx["items"]])
        vectors = embedded.embeddings
        assert embedded.prompt_eval_count == sum(len(item["ids"]) for item in fx["items"])
    for got, item in zip(vectors, fx["items"], strict=True):
        assert _cosine(got, item["embedding"]) >= 0.9999, item["text"]


def test_encoder_kind_is_shown_and_chat_refused(encoders: LiveServer) -> None:
    shown = run_llmd(encoders.env, "show", "bert")
    assert shown.returncode == 0 and re.search(
        r"kind\s+embed \(CLS-token pooling, normalized\)", shown.stdout
    )
    chat = httpx.post(
        encoders.base_url + "/v1/chat/completions",
        json={"model": "nomic_bert-gguf", "messages": [{"role": "user", "content": "w5"}]},
    )
    assert chat.status_code == 400, chat.text
    assert chat.json()["error"]["code"] == "wrong_model_kind", chat.text
    too_long = httpx.post(
        encoders.base_url + "/v1/embeddings",
        json={"model": "bert", "input": " ".join(["w9"] * 100)},
    )
    assert (
        too_long.status_code == 400
        and too_long.json()["error"]["code"] == "context_length_exceeded"
    )


def test_dense_modules_project_the_pooled_vector(encoders: LiveServer) -> None:
    """BERT with a sentence-transformers Dense module (tanh, 64 -> 48) between the pooling and
    the Normalize module: the vectors are the projected ones, 48 values long."""
    fx = FIXTURE["bert_dense"]
    client = OpenAI(base_url=encoders.base_url + "/v1", api_key="unused")
    out = client.embeddings.create(model="bert_dense", input=[i["text"] for i in fx["items"]])
    for got, item in zip(out.data, fx["items"], strict=True):
        assert len(got.embedding) == 48
        assert _cosine(got.embedding, item["embedding"]) >= 0.9999, item["text"]
        assert abs(np.linalg.norm(got.embedding) - 1) < 1e-5


def test_dimensions_only_for_models_trained_for_truncation(encoders: LiveServer) -> None:
    """A model whose card names Matryoshka training cuts its vectors to `dimensions` and
    renormalises them (OpenAI and Ollama routes); any other model refuses with a 400."""
    import ollama

    fx = FIXTURE["nomic_bert"]
    texts = [item["text"] for item in fx["items"]]
    client = OpenAI(base_url=encoders.base_url + "/v1", api_key="unused")
    out = client.embeddings.create(model="nomic-mrl", input=texts, dimensions=32)
    short = ollama.Client(host=encoders.base_url).embed(
        model="nomic-mrl", input=texts, dimensions=32
    )
    for got, other, item in zip(out.data, short.embeddings, fx["items"], strict=True):
        want = np.asarray(item["embedding"][:32])
        want /= np.linalg.norm(want)
        assert len(got.embedding) == 32 and len(other) == 32
        assert _cosine(got.embedding, want) >= 0.9999 and _cosine(other, want) >= 0.9999
        assert abs(np.linalg.norm(got.embedding) - 1) < 1e-5
    shown = run_llmd(encoders.env, "show", "nomic-mrl")
    assert "Matryoshka" in shown.stdout
    for model, dims, words in (("bert", 32, "Matryoshka"), ("nomic-mrl", 65, "exceeds")):
        refused = httpx.post(
            encoders.base_url + "/v1/embeddings",
            json={"model": model, "input": "w5", "dimensions": dims},
        )
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "dimensions"
        assert words in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    ("model", "arch"), [("tiny-xlmr-reranker", "xlm-roberta"), ("bert-reranker.gguf", "bert")]
)
def test_cross_encoders_rerank_like_transformers(
    encoders: LiveServer, model: str, arch: str
) -> None:
    """/v1/rerank with a cross-encoder directory (XLM-RoBERTa, bge-reranker style) and a
    llama.cpp rank GGUF (BERT): same order and scores as transformers' classifier."""
    fx = FIXTURE[f"rerank_{arch}"]
    documents = [item["document"] for item in fx["items"]]
    out = httpx.post(
        encoders.base_url + "/v1/rerank",
        json={
            "model": model,
            "query": fx["query"],
            "documents": documents,
            "return_documents": True,
        },
        timeout=120,
    )
    assert out.status_code == 200, out.text
    results = out.json()["results"]
    want = sorted(range(len(documents)), key=lambda i: -fx["items"][i]["score"])
    assert [r["index"] for r in results] == want
    for r in results:
        assert abs(r["relevance_score"] - fx["items"][r["index"]]["score"]) < 1e-4
        assert r["document"]["text"] == documents[r["index"]]
    assert out.json()["usage"]["prompt_tokens"] == sum(len(i["ids"]) for i in fx["items"])
    shown = run_llmd(encoders.env, "show", model)
    assert re.search(r"kind\s+rerank \(cross-encoder\)", shown.stdout)


def test_a_worker_dying_mid_request_is_retried_once(encoders: LiveServer) -> None:
    """The worker is killed while it embeds a large request: the daemon restarts it and sends
    the request once more, so the client gets every vector, later but right."""
    if encoders.backend != "cpu":  # type: ignore[attr-defined]
        pytest.skip("the retry is the daemon's: one backend shows it")
    import signal
    import threading
    import time

    fx = FIXTURE["nomic_bert"]
    longest = max(fx["items"], key=lambda item: len(item["ids"]))
    texts = [longest["text"]] * 2000  # 84,000 tokens
    httpx.post(encoders.base_url + "/v1/embeddings", json={"model": "nomic-mrl", "input": "w5"})

    def pid() -> int:
        # The model's ready worker; right after a retried request its replacement may still be
        # reporting another state for a moment (seen once in CI), so wait for it.
        deadline = time.monotonic() + 30
        while True:
            models = httpx.get(encoders.base_url + "/status").json()["models"]
            ready = [m["pid"] for m in models if m["name"] == "nomic-mrl" and m["state"] == "ready"]
            if ready:
                return ready[0]
            assert time.monotonic() < deadline, f"no ready worker for nomic-mrl: {models}"
            time.sleep(0.1)

    first = pid()
    result: dict = {}
    sent = threading.Thread(
        target=lambda: result.update(
            r=httpx.post(
                encoders.base_url + "/v1/embeddings",
                json={"model": "nomic-mrl", "input": texts},
                timeout=300,
            )
        )
    )
    sent.start()
    time.sleep(0.5)
    assert sent.is_alive()  # killed while the request runs
    os.kill(first, signal.SIGKILL)
    sent.join(300)
    assert result["r"].status_code == 200, result["r"].text
    data = result["r"].json()["data"]
    assert len(data) == len(texts) and pid() != first
    for got in data[:: len(texts) // 10]:
        assert _cosine(got["embedding"], longest["embedding"]) >= 0.9999
