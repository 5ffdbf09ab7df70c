"""`--context-length` beyond the model's trained context (as llama-server's -c and Ollama's
num_ctx): a model served with more context than it was trained on takes a prompt past its
trained context, and the daemon says the quality there is not guaranteed (log, /status,
`llmd status`). Agents need this: their system prompts and tools alone pass 8k tokens.

The model is the test model's own file with only its trained context (`llama.context_length`)
rewritten from 8192 to 1024, pulled under a name of its own: the same weights, tokenizer and
template, and the same bookkeeping, for a prompt of ~1,100 tokens. The real 8192 would need a
prompt past 8k tokens, whose prefill alone took 76-156 s of the suite on a 2-core Zen 1."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, run_llmd, short_home, start_server, stop_server

NAME = "smollm2-trained-1k"
CONTEXT = 2048
TRAINED = 1024
PROMPT_TOKENS = 1_100  # past the trained context by more than a KV block


def _with_trained_context(model_path: Path, dest: Path, trained: int) -> Path:
    """A copy of the GGUF whose `llama.context_length` says `trained` (patched in place)."""
    from gguf import GGUFReader

    shutil.copyfile(model_path, dest)
    field = GGUFReader(dest, "r+").fields["llama.context_length"]
    field.parts[field.data[0]][0] = trained
    return dest


@pytest.fixture(scope="module")
def long_server(model_path: Path) -> Iterator[LiveServer]:
    pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")
    home = short_home()
    live = start_server(home, "--context-length", str(CONTEXT))
    model = _with_trained_context(model_path, home / "trained-1k.gguf", TRAINED)
    pulled = run_llmd(live.env, "pull", str(model), "--name", NAME)
    assert pulled.returncode == 0, pulled.stderr
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


def _post(server: LiveServer, path: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def _get(server: LiveServer, path: str) -> dict:
    with urllib.request.urlopen(server.base_url + path, timeout=30) as r:
        return json.load(r)


def test_a_prompt_past_the_trained_context_is_served(long_server: LiveServer, text_model) -> None:  # type: ignore[no-untyped-def]
    sentence = text_model.encode("The quick brown fox jumps over the lazy dog. ", add_bos=False)
    ids = (sentence * (PROMPT_TOKENS // len(sentence) + 1))[:PROMPT_TOKENS]
    out = _post(long_server, "/v1/completions", {"model": NAME, "prompt": ids, "max_tokens": 2})
    assert out["usage"]["prompt_tokens"] == PROMPT_TOKENS > TRAINED
    assert out["usage"]["completion_tokens"] >= 1

    (entry,) = [m for m in _get(long_server, "/status")["models"] if m["name"] == NAME]
    assert entry["context_length"] == CONTEXT
    assert entry["trained_context_length"] == TRAINED
    assert "not guaranteed" in entry["context_warning"]
    assert f"beyond the {TRAINED}" in long_server.log.read_text()
    shown = run_llmd(long_server.env, "status")
    assert shown.returncode == 0, shown.stderr
    assert f"context {CONTEXT} tokens (trained: {TRAINED})" in shown.stdout
    assert "not guaranteed" in shown.stdout


def test_the_served_context_still_bounds_requests(long_server: LiveServer) -> None:
    """Beyond the served context (not the trained one) a prompt is refused as before."""
    req = urllib.request.Request(
        long_server.base_url + "/v1/completions",
        data=json.dumps({"model": NAME, "prompt": [1] * (CONTEXT + 10), "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code == 400
    assert json.load(refused.value)["error"]["code"] == "context_length_exceeded"
