"""Embeddings and reranking for remote models: a second `llmd serve` holds the tiny Qwen3
embedding and reranker models (tests/native/tiny_embedding_models.py) and the daemon the
clients talk to forwards `/v1/embeddings` and the rerank routes to it. What a client gets must
be what the upstream answers when asked directly, under the local name."""

from __future__ import annotations

import base64
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import BadRequestError, OpenAI

from tests.conftest import LiveServer, run_llmd, serving, short_home, start_server, stop_server
from tests.native.tiny_embedding_models import write_embedding_dir, write_reranker_dir

from .test_metrics import scrape, value

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The far daemon, with `tiny-embed` and `tiny-reranker` installed."""
    root = tmp_path_factory.mktemp("remote-embedding-models")
    write_embedding_dir(root / "embed", "mean")
    write_reranker_dir(root / "reranker")
    with serving() as live:
        for directory, name in (
            (root / "embed", "tiny-embed"),
            (root / "reranker", "tiny-reranker"),
        ):
            pulled = run_llmd(live.env, "pull", str(directory), "--name", name, timeout=300)
            assert pulled.returncode == 0, pulled.stderr
        yield live


@pytest.fixture(scope="module")
def local(upstream: LiveServer) -> Iterator[LiveServer]:
    """The daemon clients talk to: `far-embed` and `far-rerank` live on the upstream."""
    home = short_home()
    live = start_server(home)
    for name, model in (("far-embed", "tiny-embed"), ("far-rerank", "tiny-reranker")):
        url = upstream.base_url + "/v1"
        added = run_llmd(live.env, "remote", "add", name, "--url", url, "--model", model)
        assert added.returncode == 0, added.stderr
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


def _openai(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=300)


def test_embeddings_are_the_upstreams_under_the_local_name(
    local: LiveServer, upstream: LiveServer
) -> None:
    texts = ["def add(a, b): return a + b", "the quick brown fox"]
    here = _openai(local).embeddings.create(model="far-embed", input=texts)
    there = _openai(upstream).embeddings.create(model="tiny-embed", input=texts)
    assert here.model == "far-embed"
    assert [d.embedding for d in here.data] == [d.embedding for d in there.data]
    assert here.usage.prompt_tokens == there.usage.prompt_tokens > 0


def test_base64_embeddings_travel_as_the_upstream_encoded_them(
    local: LiveServer, upstream: LiveServer
) -> None:
    body = {"input": "hello", "encoding_format": "base64"}
    here = _post(local, "/v1/embeddings", {**body, "model": "far-embed"})
    there = _post(upstream, "/v1/embeddings", {**body, "model": "tiny-embed"})
    assert here.status_code == 200, here.text
    packed = here.json()["data"][0]["embedding"]
    assert packed == there.json()["data"][0]["embedding"]
    values = struct.unpack(f"<{len(base64.b64decode(packed)) // 4}f", base64.b64decode(packed))
    assert len(values) > 0 and any(v != 0 for v in values)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking"])
def test_rerank_is_the_upstreams_from_every_alias(
    local: LiveServer, upstream: LiveServer, path: str
) -> None:
    body = {
        "query": "how do I add two numbers in python",
        "documents": ["def add(a, b): return a + b", "a recipe for bread", "print(1 + 2)"],
        "top_n": 2,
        "return_documents": True,
    }
    here = _post(local, path, {**body, "model": "far-rerank"})
    there = _post(upstream, "/v1/rerank", {**body, "model": "tiny-reranker"})
    assert here.status_code == 200, here.text
    assert here.json()["model"] == "far-rerank"
    # The upstream scored the pairs twice (once for us, once asked directly); the second time
    # its prefix cache holds the shared query, so the floats may differ in the last bits and
    # near-ties may swap: compare scores by document, to float32 precision.
    ours = {r["index"]: r for r in here.json()["results"]}
    theirs = {
        r["index"]: r
        for r in _post(
            upstream, "/v1/rerank", {**body, "top_n": None, "model": "tiny-reranker"}
        ).json()["results"]
    }
    assert len(ours) == 2 and len(there.json()["results"]) == 2
    for index, result in ours.items():
        assert result["document"] == {"text": body["documents"][index]}
        assert result["relevance_score"] == pytest.approx(
            theirs[index]["relevance_score"], rel=1e-4
        )
    scores = [r["relevance_score"] for r in here.json()["results"]]
    assert scores == sorted(scores, reverse=True)


def test_an_upstream_refusal_comes_back_with_its_status_and_reason(local: LiveServer) -> None:
    """Embedding with the reranker: the upstream's own 400 (wrong kind of model), relayed."""
    with pytest.raises(BadRequestError) as refused:
        _openai(local).embeddings.create(model="far-rerank", input="hi")
    assert "rerank" in str(refused.value)


def test_requests_are_validated_before_they_leave(local: LiveServer) -> None:
    """A malformed body is refused here, in the same words as for a local model."""
    answer = _post(local, "/v1/rerank", {"model": "far-rerank", "query": "q"})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "documents"


def test_the_remote_counts_its_requests_on_metrics(local: LiveServer) -> None:
    before = value(
        scrape(local.base_url), "llmd_remote_requests_total", remote="far-embed", outcome="ok"
    )
    _openai(local).embeddings.create(model="far-embed", input="count me")
    after = value(
        scrape(local.base_url), "llmd_remote_requests_total", remote="far-embed", outcome="ok"
    )
    assert after == before + 1


def test_a_local_model_by_that_name_still_wins(local: LiveServer, tmp_path: Path) -> None:
    """Remotes never shadow local models: the same name installed here answers here."""
    write_embedding_dir(tmp_path / "mine", "last")
    pulled = run_llmd(local.env, "pull", str(tmp_path / "mine"), "--name", "far-embed")
    assert pulled.returncode == 0, pulled.stderr
    try:
        here = _openai(local).embeddings.create(model="far-embed", input="hi")
        status = httpx.get(local.base_url + "/status", timeout=30).json()
        assert here.data and any(m["name"] == "far-embed" for m in status["models"])
    finally:
        run_llmd(local.env, "rm", "far-embed")
