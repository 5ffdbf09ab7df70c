"""EmbeddingGemma through `llmd serve`, as a user reaches it: a tiny random one
(tests/native/tiny_embedding_models.py: bidirectional Gemma 3, mean pooling, two Dense modules,
Normalize, a model card naming Matryoshka training) pulled from its local sentence-transformers
directory, then asked through the official `openai` and `ollama` clients. Vectors are compared
with sentence-transformers' on the same files (tests/fixtures/embeddinggemma_transformers.json,
recorded by tests/fixtures/record_embeddinggemma.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import LiveServer, run_llmd
from tests.native.tiny_embedding_models import write_embeddinggemma_dir

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "embeddinggemma_transformers.json").read_text()
)
NAME = "tiny-embeddinggemma"


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


@pytest.fixture(scope="module")
def model(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("embeddinggemma") / "embeddinggemma"
    write_embeddinggemma_dir(directory)
    pulled = run_llmd(server.env, "pull", str(directory), "--name", NAME, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    return NAME


def test_openai_client_embeds_like_sentence_transformers(server: LiveServer, model: str) -> None:
    items = FIXTURE["items"]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    out = client.embeddings.create(model=model, input=[item["text"] for item in items])
    assert [d.index for d in out.data] == list(range(len(items)))
    for got, item in zip(out.data, items, strict=True):
        assert len(got.embedding) == 64  # after both Dense modules (64 -> 256 -> 64)
        assert _cosine(got.embedding, item["embedding"]) >= 0.9999, item["text"]
        assert abs(np.linalg.norm(got.embedding) - 1) < 1e-5
    # <bos> and <eos> that the tokenizer wraps every input in are counted.
    assert out.usage.prompt_tokens == sum(len(item["ids"]) for item in items)


def test_ollama_client_and_matryoshka_dimensions(server: LiveServer, model: str) -> None:
    """The model card names Matryoshka training (as EmbeddingGemma's does): `dimensions` cuts
    each vector and renormalises it, on the Ollama route as on the OpenAI one."""
    import ollama

    items = FIXTURE["items"]
    texts = [item["text"] for item in items]
    embedded = ollama.Client(host=server.base_url).embed(model=model, input=texts)
    short = OpenAI(base_url=server.base_url + "/v1", api_key="unused").embeddings.create(
        model=model, input=texts, dimensions=16
    )
    for full, cut, item in zip(embedded.embeddings, short.data, items, strict=True):
        assert _cosine(full, item["embedding"]) >= 0.9999, item["text"]
        want = np.asarray(item["embedding"][:16])
        assert len(cut.embedding) == 16
        assert _cosine(cut.embedding, want / np.linalg.norm(want)) >= 0.9999
        assert abs(np.linalg.norm(cut.embedding) - 1) < 1e-5


def test_kind_is_shown_and_chat_is_refused(server: LiveServer, model: str) -> None:
    shown = run_llmd(server.env, "show", model)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"kind\s+embed \(mean pooling, normalized, Matryoshka\)", shown.stdout)
    chat = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "w5 w6"}]},
        timeout=60,
    )
    assert chat.status_code == 400, chat.text
    error = chat.json()["error"]
    assert error["code"] == "wrong_model_kind" and "embed" in error["message"], error
    too_long = httpx.post(
        server.base_url + "/v1/embeddings",
        json={"model": model, "input": " ".join(["w9"] * 200)},
        timeout=60,
    )
    assert too_long.status_code == 400, too_long.text
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_without_its_sentence_transformers_files_the_pull_is_refused(
    server: LiveServer, tmp_path: Path
) -> None:
    """A bidirectional Gemma 3 cannot generate text: a copy whose pooling files are gone is
    refused at pull with the reason, instead of being listed as a chat model."""
    directory = tmp_path / "bare"
    write_embeddinggemma_dir(directory)
    (directory / "modules.json").unlink()
    shutil.rmtree(directory / "1_Pooling")
    pulled = run_llmd(server.env, "pull", str(directory), "--name", "bare-eg", timeout=300)
    assert pulled.returncode != 0
    assert "bidirectional attention" in pulled.stderr and "Pooling module" in pulled.stderr
    listed = run_llmd(server.env, "list")
    assert "bare-eg" not in listed.stdout
