"""Embeddings and reranking through `llmd serve`, as a user reaches them: tiny random Qwen3
embedding and reranker directories (tests/native/tiny_embedding_models.py) pulled from local
Hugging Face directories into the running daemon, then asked through the official `openai`
and `ollama` clients and plain HTTP. Vectors and scores are compared with transformers' on the
same files (tests/fixtures/qwen3_embeddings_transformers.json, recorded by
tests/fixtures/record_embeddings.py)."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import BadRequestError, OpenAI

from tests.conftest import LiveServer, run_llmd
from tests.native.tiny_embedding_models import write_embedding_dir, write_reranker_dir

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "qwen3_embeddings_transformers.json").read_text()
)


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def _pull(server: LiveServer, directory: Path, name: str) -> str:
    pulled = run_llmd(server.env, "pull", str(directory), "--name", name, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    return pulled.stdout


@pytest.fixture(scope="module")
def models(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny embedding (last-token and mean pooling) and reranker models, pulled once."""
    root = tmp_path_factory.mktemp("embedding-models")
    write_embedding_dir(root / "embed-last", "last")
    write_embedding_dir(root / "embed-mean", "mean")
    write_reranker_dir(root / "tiny-qwen3-reranker")
    names = {"last": "tiny-embed-last", "mean": "tiny-embed-mean", "rerank": "tiny-reranker"}
    _pull(server, root / "embed-last", names["last"])
    _pull(server, root / "embed-mean", names["mean"])
    _pull(server, root / "tiny-qwen3-reranker", names["rerank"])
    return names


def _client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused")


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_openai_client_embeddings_match_transformers(
    server: LiveServer, models: dict[str, str], pooling: str
) -> None:
    fx = FIXTURE[f"embed_{pooling}"]
    out = _client(server).embeddings.create(model=models[pooling], input=fx["texts"])
    assert [d.index for d in out.data] == list(range(len(fx["texts"])))
    for got, want in zip(out.data, fx["embeddings"], strict=True):
        assert len(got.embedding) == len(want)
        assert _cosine(got.embedding, want) >= 0.9999
    if pooling == "last":  # the Normalize module: unit vectors
        assert all(abs(np.linalg.norm(d.embedding) - 1) < 1e-5 for d in out.data)
    tokens = sum(len(ids) for ids in fx["ids"])  # the tokenizer's appended end token counted
    assert out.usage.prompt_tokens == tokens and out.usage.total_tokens == tokens


def test_inputs_of_one_request_share_engine_steps(
    server: LiveServer, models: dict[str, str]
) -> None:
    texts = [f"w{i} w{i + 1} w{i + 2}" for i in range(3, 40)]
    out = _client(server).embeddings.create(model=models["last"], input=texts)
    assert len(out.data) == len(texts)
    metrics = httpx.get(server.base_url + "/metrics").text
    line = f'llmd_engine_max_embeddings_in_a_step{{model="{models["last"]}"}}'
    batched = re.search(re.escape(line) + r" (\S+)", metrics)
    assert batched is not None and float(batched.group(1)) >= 2, metrics
    inputs = re.search(r'llmd_embedded_inputs_total\{model="tiny-embed-last"\} (\S+)', metrics)
    assert inputs is not None and float(inputs.group(1)) >= len(texts)


def test_token_id_inputs_and_base64_round_trip(server: LiveServer, models: dict[str, str]) -> None:
    fx = FIXTURE["embed_last"]
    url = server.base_url + "/v1/embeddings"
    floats = httpx.post(url, json={"model": models["last"], "input": fx["ids"]}).json()
    packed = httpx.post(
        url, json={"model": models["last"], "input": fx["ids"], "encoding_format": "base64"}
    ).json()
    for f, b, want in zip(floats["data"], packed["data"], fx["embeddings"], strict=True):
        raw = base64.b64decode(b["embedding"])
        decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert decoded == pytest.approx(f["embedding"], abs=1e-7)
        assert _cosine(decoded, want) >= 0.9999
    one = httpx.post(url, json={"model": models["last"], "input": fx["ids"][0]}).json()
    assert (
        len(one["data"]) == 1
        and _cosine(one["data"][0]["embedding"], fx["embeddings"][0]) >= 0.9999
    )


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def test_embedding_errors_are_400s_in_the_openai_envelope(
    server: LiveServer, models: dict[str, str], model_path: Path
) -> None:
    url = server.base_url + "/v1/embeddings"
    name = models["last"]
    empty = httpx.post(url, json={"model": name, "input": []})
    assert empty.status_code == 400 and "input" in _error(empty)["message"]
    blank = httpx.post(url, json={"model": name, "input": ["w5", ""]})
    assert blank.status_code == 400 and _error(blank)["param"] == "input.[1]"
    long_text = " ".join(["w9"] * 600)  # the tiny model's context is 512
    too_long = httpx.post(url, json={"model": name, "input": long_text})
    assert too_long.status_code == 400
    assert _error(too_long)["code"] == "context_length_exceeded"
    cut = httpx.post(url, json={"model": name, "input": long_text, "truncate": True})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 512
    dims = httpx.post(url, json={"model": name, "input": "w5", "dimensions": 8})
    assert dims.status_code == 400 and _error(dims)["param"] == "dimensions"
    with pytest.raises(BadRequestError, match="embed model"):
        _client(server).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "w5"}], max_tokens=2
        )
    generator = run_llmd(server.env, "pull", str(model_path), "--name", "gen-for-embed")
    assert generator.returncode == 0, generator.stderr
    wrong = httpx.post(url, json={"model": "gen-for-embed", "input": "hello"})
    assert wrong.status_code == 400 and _error(wrong)["code"] == "wrong_model_kind"
    assert "generate model" in _error(wrong)["message"]


def test_ollama_client_embed_and_embeddings(server: LiveServer, models: dict[str, str]) -> None:
    import ollama

    fx = FIXTURE["embed_mean"]
    client = ollama.Client(host=server.base_url)
    out = client.embed(model=models["mean"], input=fx["texts"])
    assert len(out.embeddings) == len(fx["texts"])
    for got, want in zip(out.embeddings, fx["embeddings"], strict=True):
        assert _cosine(got, want) >= 0.9999
        assert abs(np.linalg.norm(got) - 1) < 1e-5  # /api/embed normalises, as Ollama
    assert out.prompt_eval_count == sum(len(ids) for ids in fx["ids"])
    assert out.total_duration and out.total_duration >= (out.load_duration or 0)
    old = client.embeddings(model=models["mean"], prompt=fx["texts"][1])
    assert _cosine(list(old.embedding), fx["embeddings"][1]) >= 0.9999
    long_text = " ".join(["w9"] * 600)
    truncated = client.embed(model=models["mean"], input=long_text)  # truncate: true by default
    assert truncated.prompt_eval_count == 512
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=models["mean"], input=long_text, truncate=False)
    assert refused.value.status_code == 400


def test_rerank_scores_and_order_match_transformers(
    server: LiveServer, models: dict[str, str]
) -> None:
    fx = FIXTURE["rerank"]
    body = {"model": models["rerank"], "query": fx["query"], "documents": fx["documents"]}
    for path in ("/v1/rerank", "/rerank", "/v1/reranking"):
        out = httpx.post(server.base_url + path, json=body).json()
        results = out["results"]
        want_order = sorted(range(len(fx["scores"])), key=lambda i: -fx["scores"][i])
        assert [r["index"] for r in results] == want_order
        for r in results:
            assert r["relevance_score"] == pytest.approx(fx["scores"][r["index"]], abs=2e-4)
            assert "document" not in r
        assert out["usage"]["prompt_tokens"] == sum(len(ids) for ids in fx["ids"])
    top = httpx.post(
        server.base_url + "/v1/rerank", json={**body, "top_n": 2, "return_documents": True}
    ).json()["results"]
    assert [r["index"] for r in top] == want_order[:2]
    assert [r["document"]["text"] for r in top] == [fx["documents"][i] for i in want_order[:2]]


def test_kind_is_shown_and_refused_where_wrong(server: LiveServer, models: dict[str, str]) -> None:
    shown = run_llmd(server.env, "show", models["last"])
    assert shown.returncode == 0 and re.search(
        r"kind\s+embed \(last-token pooling, normalized\)", shown.stdout
    )
    assert re.search(r"kind\s+rerank", run_llmd(server.env, "show", models["rerank"]).stdout)
    listed = {m["id"]: m for m in httpx.get(server.base_url + "/v1/models").json()["data"]}
    assert listed[models["mean"]]["kind"] == "embed"
    assert listed[models["mean"]]["capabilities"]["embeddings"] is True
    assert listed[models["mean"]]["capabilities"]["completion"] is False
    show = httpx.post(server.base_url + "/api/show", json={"model": models["last"]}).json()
    assert show["capabilities"] == ["embedding"]
    wrong = httpx.post(
        server.base_url + "/v1/rerank",
        json={"model": models["last"], "query": "w1", "documents": ["w2"]},
    )
    assert wrong.status_code == 400 and _error(wrong)["code"] == "wrong_model_kind"
    chat = httpx.post(
        server.base_url + "/api/chat",
        json={
            "model": models["rerank"],
            "messages": [{"role": "user", "content": "w3"}],
            "stream": False,
        },
    )
    assert chat.status_code == 400 and "rerank model" in chat.json()["error"]


def test_gguf_with_pooling_type_embeds_like_transformers(
    server: LiveServer, tmp_path: Path
) -> None:
    from tests.native.tiny_embedding_models import write_embedding_gguf

    write_embedding_gguf(tmp_path / "embed.gguf", pooling_type=3)  # last token, as Qwen3-Embedding
    _pull(server, tmp_path / "embed.gguf", "tiny-embed-gguf")
    fx = FIXTURE["embed_last"]
    out = _client(server).embeddings.create(model="tiny-embed-gguf", input=fx["ids"])
    for got, want in zip(out.data, fx["embeddings"], strict=True):
        assert _cosine(got.embedding, want) >= 0.9999
    write_embedding_gguf(tmp_path / "rank.gguf", pooling_type=4)
    refused = run_llmd(server.env, "pull", str(tmp_path / "rank.gguf"), "--name", "tiny-rank-gguf")
    assert refused.returncode != 0 and "reranking GGUF files" in refused.stderr
