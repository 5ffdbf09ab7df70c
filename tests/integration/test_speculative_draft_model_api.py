"""Speculative decoding with a draft model through the API and the CLI, real worker and model:
`llmd serve --draft-model NAME` loads it beside each model (here the test model drafts for
itself) and makes it the default drafter; `llmd set NAME --draft-model D` gives one model its
own; a draft whose vocabulary differs is refused by `llmd set` and at `llmd serve` start; and
output is the same with or without."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.draft_gguf import write_requantized

from ..conftest import LiveServer, run_llmd, serving
from ..native.tiny_models import write_loadable_gguf
from .test_metrics import scrape, value
from .test_speculative_api import EDIT, MODEL, post

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")


@pytest.fixture(scope="module")
def draft_server(model_path) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    with serving("--draft-model", MODEL) as live:
        yield live


def status_of(server: LiveServer, name: str) -> dict:
    with urllib.request.urlopen(server.base_url + "/status", timeout=30) as r:
        return next(m for m in json.loads(r.read())["models"] if m["name"] == name)


def test_the_server_draft_model_drafts_by_default_and_output_is_unchanged(
    draft_server: LiveServer,
) -> None:
    body = {"messages": EDIT, "temperature": 0, "max_tokens": 120}
    status, spec = post(draft_server, body)
    assert status == 200, spec
    _, plain = post(draft_server, {**body, "speculative": False})
    _, ngram = post(draft_server, {**body, "speculative": {"type": "ngram"}})
    content = plain["choices"][0]["message"]["content"]
    assert spec["choices"][0]["message"]["content"] == content
    assert ngram["choices"][0]["message"]["content"] == content
    drafted = spec["usage"]["speculative"]
    # The model drafting for itself: nearly every draft is kept.
    assert drafted["accepted_tokens"] >= 0.9 * drafted["drafted_tokens"] > 0
    assert status_of(draft_server, MODEL)["speculative"] == {
        "drafter": "draft_model",
        "max_draft": 8,
        "available": ["ngram", "draft_model"],
        "draft_model": MODEL,
    }


def test_sampled_requests_draft_with_it_too(draft_server: LiveServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Tell me a story about a fox."}],
        "temperature": 0.8,
        "seed": 3,
        "max_tokens": 60,
        "speculative": {"type": "draft_model", "max_draft": 4},
    }
    status, a = post(draft_server, body)
    assert status == 200, a
    before = scrape(draft_server.base_url)
    _, b = post(draft_server, body)
    after = scrape(draft_server.base_url)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["speculative"]["accepted_tokens"] > 0
    # The repeated prompt's draft KV came from the draft model's own prefix cache.
    name = "llmd_speculative_draft_cached_tokens_total"
    reused = value(after, name, model=MODEL) - value(before, name, model=MODEL)
    assert reused >= b["usage"]["prompt_tokens"] // 64 * 64 and reused > 0


def test_a_model_own_draft_model_and_vocabulary_refusals(
    draft_server: LiveServer, model_path: Path, tmp_path: Path
) -> None:
    env = draft_server.env
    other = write_loadable_gguf(tmp_path / "tiny.gguf")  # a 128-token vocabulary
    assert run_llmd(env, "pull", str(other), "--name", "tiny-vocab").returncode == 0
    refused = run_llmd(env, "set", MODEL, "--draft-model", "tiny-vocab")
    assert refused.returncode != 0
    assert "vocabularies differ" in refused.stderr
    # Nor may a server start with it as the draft of a model it preloads.
    start = run_llmd(env, "serve", "--port", "0", "--draft-model", "tiny-vocab", "--preload", MODEL)
    assert start.returncode != 0 and "vocabularies differ" in start.stderr

    cut = write_requantized(model_path, tmp_path / "cut.gguf")
    assert run_llmd(env, "pull", str(cut), "--name", "smol-cut").returncode == 0
    done = run_llmd(env, "set", MODEL, "--draft-model", "smol-cut")
    assert done.returncode == 0, done.stderr
    body = {"messages": EDIT, "temperature": 0, "max_tokens": 80}
    _, spec = post(draft_server, body)  # reloads with its own draft model
    _, plain = post(draft_server, {**body, "speculative": False})
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert status_of(draft_server, MODEL)["speculative"]["draft_model"] == "smol-cut"
    assert spec["usage"]["speculative"]["accepted_tokens"] > 0
