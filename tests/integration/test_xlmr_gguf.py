"""XLM-RoBERTa GGUF files as llama.cpp's converter writes BGE-M3 / multilingual-e5 and
bge-reranker-v2-m3 (architecture ``bert``, a SentencePiece unigram vocabulary), pulled into
`llmd serve` and asked as a user would, with the official `openai` and `ollama` clients and
/v1/rerank: texts in several scripts are tokenized as transformers tokenizes them, embedded as
sentence-transformers embeds them, and documents ranked as its CrossEncoder ranks them
(tests/fixtures/xlmr_gguf_reference.json, recorded with the files by
tests/fixtures/record_xlmr_gguf.py)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import LiveServer, run_llmd, short_home, start_server, stop_server

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURES = Path(__file__).parents[1] / "fixtures"
REFERENCE = json.loads((FIXTURES / "xlmr_gguf_reference.json").read_text())


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    home = short_home()
    live = start_server(home)
    for file, name in (("xlmr_unigram_embed.gguf", "m3"), ("xlmr_unigram_rerank.gguf", "m3-rr")):
        pulled = run_llmd(live.env, "pull", str(FIXTURES / file), "--name", name, timeout=300)
        assert pulled.returncode == 0, pulled.stderr
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


def test_openai_client_embeds_like_sentence_transformers(server: LiveServer) -> None:
    items = REFERENCE["embed"]["items"]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    out = client.embeddings.create(model="m3", input=[item["text"] for item in items])
    for got, item in zip(out.data, items, strict=True):
        assert _cosine(got.embedding, item["embedding"]) >= 0.9999, item["text"]
        assert abs(np.linalg.norm(got.embedding) - 1) < 1e-5
    # the same number of tokens as XLM-R's own tokenizer (each text's ids: tests/unit)
    assert out.usage.prompt_tokens == sum(len(item["ids"]) for item in items)


def test_ollama_client_embeds_like_sentence_transformers(server: LiveServer) -> None:
    import ollama

    items = REFERENCE["embed"]["items"]
    out = ollama.Client(host=server.base_url).embed(
        model="m3", input=[item["text"] for item in items]
    )
    for got, item in zip(out.embeddings, items, strict=True):
        assert _cosine(got, item["embedding"]) >= 0.9999, item["text"]
    assert out.prompt_eval_count == sum(len(item["ids"]) for item in items)


def test_reranker_orders_documents_like_the_cross_encoder(server: LiveServer) -> None:
    fx = REFERENCE["rerank"]
    documents = [item["document"] for item in fx["items"]]
    out = httpx.post(
        server.base_url + "/v1/rerank",
        json={"model": "m3-rr", "query": fx["query"], "documents": documents, "top_n": 4},
        timeout=120,
    )
    assert out.status_code == 200, out.text
    results = out.json()["results"]
    want = sorted(range(len(documents)), key=lambda i: -fx["items"][i]["score"])
    assert [r["index"] for r in results] == want[:4]
    for r in results:
        assert abs(r["relevance_score"] - fx["items"][r["index"]]["score"]) < 1e-4
    assert out.json()["usage"]["prompt_tokens"] == sum(len(i["ids"]) for i in fx["items"])


def test_kinds_are_shown_and_the_wrong_use_refused(server: LiveServer) -> None:
    shown = run_llmd(server.env, "show", "m3")
    assert re.search(r"kind\s+embed \(CLS-token pooling, normalized\)", shown.stdout)
    shown = run_llmd(server.env, "show", "m3-rr")
    assert re.search(r"kind\s+rerank \(cross-encoder\)", shown.stdout)
    for model, path, body in (
        ("m3", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("m3-rr", "/v1/embeddings", {"input": "hi"}),
        ("m3", "/v1/rerank", {"query": "q", "documents": ["d"]}),
    ):
        refused = httpx.post(server.base_url + path, json={"model": model, **body}, timeout=60)
        assert refused.status_code == 400, (model, path, refused.text)
        assert refused.json()["error"]["code"] == "wrong_model_kind", refused.text
    too_long = httpx.post(
        server.base_url + "/v1/embeddings",
        json={"model": "m3", "input": " ".join(["東京"] * 200)},
        timeout=60,
    )
    assert too_long.status_code == 400, too_long.text
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_ollama_keep_alive_holds_or_unloads_an_embedding_model(server: LiveServer) -> None:
    """/api/embed's keep_alive, as Ollama's: the model stays loaded for the time asked, and 0
    unloads it once the vectors are sent."""
    import datetime
    import time

    import ollama

    client = ollama.Client(host=server.base_url)
    client.embed(model="m3", input="hello", keep_alive="7m")
    loaded = {m.name: m for m in client.ps().models}
    assert "m3" in loaded, loaded
    left = loaded["m3"].expires_at - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(minutes=6) < left <= datetime.timedelta(minutes=7, seconds=5)
    out = client.embed(model="m3", input="hello", keep_alive=0)
    assert len(out.embeddings) == 1
    deadline = time.monotonic() + 30
    while "m3" in {m.name for m in client.ps().models}:
        assert time.monotonic() < deadline, "keep_alive 0 left the model loaded"
        time.sleep(0.2)


def test_a_truncated_text_embeds_as_sentence_transformers_truncates_it(
    server: LiveServer,
) -> None:
    """Asked for truncation, a text longer than the context keeps <s>, its first tokens and
    </s>, as sentence-transformers' tokenizer cuts it: the same vector (and token count) as
    the reference's, through OpenAI's route (llmd's `truncate`) and Ollama's (its default)."""
    import ollama

    fx = REFERENCE["truncated"]
    assert fx["ids"][-1] == 2 and len(fx["ids"]) == 128  # </s> kept by the reference
    out = httpx.post(
        server.base_url + "/v1/embeddings",
        json={"model": "m3", "input": fx["text"], "truncate": True},
        timeout=60,
    ).json()
    assert out["usage"]["prompt_tokens"] == len(fx["ids"])
    assert _cosine(out["data"][0]["embedding"], fx["embedding"]) >= 0.9999
    # The very ids the reference embedded (a CLS row hardly sees the last token, so the cosine
    # alone would let a cut that dropped </s> pass: 0.99994 here).
    given = httpx.post(
        server.base_url + "/v1/embeddings", json={"model": "m3", "input": fx["ids"]}, timeout=60
    ).json()
    assert np.allclose(out["data"][0]["embedding"], given["data"][0]["embedding"], atol=1e-6)
    embedded = ollama.Client(host=server.base_url).embed(model="m3", input=fx["text"])
    assert embedded.prompt_eval_count == len(fx["ids"])
    assert np.allclose(embedded.embeddings[0], given["data"][0]["embedding"], atol=1e-6)


def _metric(server: LiveServer, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    found = re.search(rf'^{name}{{model="m3"}} (\S+)$', text, re.MULTILINE)
    assert found is not None, (name, text)
    return float(found.group(1))


def test_a_client_going_away_cancels_its_embeddings(server: LiveServer) -> None:
    """Clients that give up on large requests (8 at once, each 2,048 inputs of 128 tokens: 2M
    tokens, several seconds even on a quiet machine for this tiny model, where one such request
    alone once finished within a second) leave no work behind: their sequences are cancelled in
    the engine, not run to the end, and the next request is answered at once."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    fx = REFERENCE["truncated"]
    httpx.post(server.base_url + "/v1/embeddings", json={"model": "m3", "input": "warm"})
    done_before = _metric(server, "llmd_engine_embedding_sequences_total")
    requests, per_request = 8, 2048

    def give_up() -> bool:
        try:
            httpx.post(
                server.base_url + "/v1/embeddings",
                json={"model": "m3", "input": [fx["ids"]] * per_request},
                timeout=httpx.Timeout(60, read=0.5),
            )
        except httpx.ReadTimeout:
            return True
        return False

    with ThreadPoolExecutor(requests) as pool:
        timed_out = list(pool.map(lambda _: give_up(), range(requests)))
    assert any(timed_out), "every request was answered before its client gave up"
    deadline = time.monotonic() + 20
    while _metric(server, "llmd_running_sequences") > 0:
        assert time.monotonic() < deadline, "the abandoned sequences kept running"
        time.sleep(0.2)
    assert (
        _metric(server, "llmd_engine_embedding_sequences_total") - done_before
        < requests * per_request
    )
    started = time.monotonic()
    out = httpx.post(
        server.base_url + "/v1/embeddings", json={"model": "m3", "input": "hello"}, timeout=60
    )
    assert out.status_code == 200 and time.monotonic() - started < 10


def test_a_query_over_fifty_documents(server: LiveServer) -> None:
    """The issue's check: one query over 50 documents. Every document gets a score, the
    results come sorted by it, and the recorded documents among them keep the cross-encoder's
    scores however many others share their steps."""
    fx = REFERENCE["rerank"]
    known = [item["document"] for item in fx["items"]]
    others = [f"doc {i}: {known[i % len(known)][::-1]}" for i in range(44)]
    documents = others[:20] + known + others[20:]
    out = httpx.post(
        server.base_url + "/v1/rerank",
        json={"model": "m3-rr", "query": fx["query"], "documents": documents},
        timeout=300,
    )
    assert out.status_code == 200, out.text
    results = out.json()["results"]
    assert sorted(r["index"] for r in results) == list(range(50))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    by_index = {r["index"]: r["relevance_score"] for r in results}
    for j, item in enumerate(fx["items"]):
        assert abs(by_index[20 + j] - item["score"]) < 1e-4, item["document"]


def test_a_document_past_the_context_is_a_400_unless_truncation_was_asked(
    server: LiveServer,
) -> None:
    """A (query, document) pair longer than the context names the document in a 400; with
    truncate: true the document's tail is cut (the query and the pair's special tokens kept)
    and it is scored with the others."""
    fx = REFERENCE["rerank"]
    documents = [fx["items"][1]["document"], REFERENCE["truncated"]["text"]]
    body = {"model": "m3-rr", "query": fx["query"], "documents": documents}
    refused = httpx.post(server.base_url + "/v1/rerank", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "documents.[1]"
    cut = httpx.post(server.base_url + "/v1/rerank", json={**body, "truncate": True}, timeout=60)
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == len(fx["items"][1]["ids"]) + 128
    scores = {r["index"]: r["relevance_score"] for r in cut.json()["results"]}
    assert abs(scores[0] - fx["items"][1]["score"]) < 1e-4 and 0 < scores[1] < 1
