"""Remote model records and forwarding rules (remotes.py, remote_upstream.py, remote_forward.py) without a network:
URLs, stored records, what the upstream is sent, how its errors and events come back. The
end-to-end behaviour is tests/integration/test_remote_models.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmd.api.anthropic_schemas import anthropic_error
from llmd.api.remote_forward import _event, _Seen
from llmd.errors import ContextOverflow
from llmd.paths import Paths
from llmd.runtime.remote_health import check
from llmd.runtime.remote_upstream import RemoteGate, read_lines, upstream_body, upstream_error
from llmd.store.model_store import ModelStore
from llmd.store.remotes import (
    RemoteError,
    RemoteRecord,
    RemoteStore,
    capabilities_of,
    context_of,
    normalize_url,
    parse_record,
    ssl_context,
)
from llmd.text.openai_schemas import ChatCompletionRequest, parse_request
from llmd.text.remote_chat import as_chunk, split_delta


def _paths(root: Path) -> Paths:
    return Paths(data=root / "data", cache=root / "c", logs=root / "l", runtime=root / "r")


def _record(**fields: object) -> RemoteRecord:
    return parse_record({"name": "big", "url": "http://gpu:8000", "upstream_model": "m", **fields})


@pytest.mark.parametrize(
    ("raw", "base"),
    [
        ("http://gpu:8000", "http://gpu:8000"),
        ("http://gpu:8000/", "http://gpu:8000"),
        ("http://gpu:8000/v1", "http://gpu:8000"),
        ("https://gw.example/openai/v1/", "https://gw.example/openai"),
    ],
)
def test_urls_are_reduced_to_the_base_the_api_paths_go_under(raw: str, base: str) -> None:
    assert normalize_url(raw) == base


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("ftp://gpu", "http"),
        ("gpu:8000", "http"),
        ("http://user:secret@gpu:8000", "credentials"),
        ("http://gpu:8000/v1?key=secret", "query"),
    ],
)
def test_urls_that_are_not_plain_http_endpoints_are_refused(raw: str, said: str) -> None:
    with pytest.raises(RemoteError, match=said):
        normalize_url(raw)


def test_context_comes_from_what_each_engine_reports() -> None:
    assert context_of({"id": "m", "max_model_len": 32768}) == 32768  # vLLM, SGLang, llmd
    assert context_of({"id": "m", "meta": {"n_ctx_train": 8192}}) == 8192  # llama-server
    assert context_of({"id": "m", "meta": {"n_ctx": 4096, "n_ctx_train": 8192}}) == 4096
    assert context_of({"id": "m"}) is None


def test_a_record_round_trips_and_holds_only_the_keys_variable_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    paths = _paths(tmp_path)
    remotes = RemoteStore(paths)
    record = remotes.add(_record(api_key_env="MY_KEY", context_length=4096), ModelStore(paths))
    assert remotes.get("big") == record and remotes.list() == [record]
    stored = (remotes.root / "big.json").read_text()
    assert "MY_KEY" in stored and "sk-very-secret" not in stored
    assert record.headers()["Authorization"] == "Bearer sk-very-secret"
    assert record.host == "gpu:8000"
    with pytest.raises(RemoteError) as taken:
        remotes.add(record, ModelStore(paths))
    assert taken.value.status == 409
    remotes.remove("big")
    assert remotes.get("big") is None and remotes.list() == []


def test_a_missing_key_variable_is_said_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(RemoteError, match="MY_KEY"):
        _record(api_key_env="MY_KEY").headers()
    with pytest.raises(RemoteError, match="api_key_env"):
        _record(api_key_env="NOT A NAME")


def test_the_upstream_gets_what_the_client_set_under_its_own_model_id() -> None:
    req = parse_request(
        {
            "model": "big",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0,
            "session_id": "s1",
            "keep_alive": "5m",
            "user": "me",
            "response_format": {"type": "json_schema", "json_schema": {"schema": {}}},
        },
        ChatCompletionRequest,
    )
    body = upstream_body(req, _record())
    assert body["model"] == "m" and body["temperature"] == 0
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["response_format"]["json_schema"] == {"schema": {}}
    assert not {"session_id", "keep_alive", "user", "top_p", "stream"} & set(body)


def test_upstream_errors_keep_4xx_and_hide_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    remote = _record(api_key_env="MY_KEY")
    text = json.dumps({"error": {"message": "bad key sk-very-secret", "code": "invalid_api_key"}})
    err = upstream_error(remote, 401, text, {})
    assert err.status == 401 and err.code == "invalid_api_key"
    assert "sk-very-secret" not in err.message and "***" in err.message
    assert upstream_error(remote, 500, "boom", {}).status == 502
    busy = upstream_error(remote, 503, "{}", {"Retry-After": "3"})
    assert busy.status == 503 and busy.retry_after == "3"


def test_stream_events_are_renamed_and_otherwise_untouched() -> None:
    event = _event([b'data: {"model": "m", "choices": []}'], "big", _Seen())
    assert json.loads(event.removeprefix(b"data: ")) == {"model": "big", "choices": []}
    assert _event([b"data: [DONE]"], "big", _Seen()) == b"data: [DONE]\n\n"
    assert _event([b": keep-alive"], "big", _Seen()) == b": keep-alive\n\n"


async def test_a_down_upstream_is_checked_again_sooner_then_backing_off() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = _record(url=f"http://127.0.0.1:{port}")
    gate = RemoteGate()
    delays = []
    for _ in range(3):
        await check(gate, remote, interval=30, max_backoff=12)
        health = gate.health("big")
        assert health.healthy is False and "cannot reach" in (health.last_error or "")
        delays.append(health.next_check - (health.checked_at or 0))
    assert delays == [5, 10, 12]
    assert gate.status(remote)["healthy"] is False


async def test_stream_lines_of_any_length_are_split_whatever_the_chunks() -> None:
    class Content:  # what read_lines reads of aiohttp's StreamReader
        async def iter_any(self):  # type: ignore[no-untyped-def]
            big = b"data: " + b"x" * 300_000
            for chunk in (big[:1000], big[1000:] + b"\r\n\nda", b"ta: [DONE]\n\n"):
                yield chunk

    got = [line async for line in read_lines(Content())]  # type: ignore[arg-type]
    assert got == [b"data: " + b"x" * 300_000, b"", b"data: [DONE]", b""]


def test_upstream_chunks_become_one_pipeline_delta_per_piece() -> None:
    lp = {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": []}]}
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}
    got = split_delta({"reasoning": "hmm", "content": "a", "tool_calls": [call]}, lp)
    assert got == [
        ({"reasoning_content": "hmm"}, lp),  # vLLM's newer name, as llmd's own
        ({"content": "a"}, None),
        ({"tool_calls": [call]}, None),
    ]
    assert split_delta({"role": "assistant", "content": ""}, None) == []
    assert split_delta({"content": ""}, lp) == [({"content": ""}, lp)]  # logprobs kept


def test_a_ca_bundle_is_stored_as_an_absolute_path_and_must_be_readable(tmp_path: Path) -> None:
    record = parse_record(
        {"name": "m", "url": "https://h", "upstream_model": "m", "ca_bundle": str(tmp_path / "x")}
    )
    assert record.ca_bundle == str(tmp_path / "x")
    with pytest.raises(RemoteError, match="CA bundle"):
        ssl_context(record)  # never a fall back to no verification
    plain = parse_record({"name": "m", "url": "https://h", "upstream_model": "m"})
    assert ssl_context(plain) is True  # the system's CAs


@pytest.mark.parametrize(
    ("error", "prompt", "context"),
    [
        (  # llmd
            {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 20003 tokens (at least one token must be left to "
                "generate). Please reduce the length of the messages.",
                "code": "context_length_exceeded",
            },
            20003,
            8192,
        ),
        (  # vLLM
            {
                "message": "This model's maximum context length is 4096 tokens. However, you "
                "requested 5000 tokens (4000 in the messages, 1000 in the completion). "
                "Please reduce the length of the messages or completion."
            },
            4000,
            4096,
        ),
        (  # llama-server
            {
                "message": "request (3000 tokens) exceeds the available context size (2048 "
                "tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 3000,
                "n_ctx": 2048,
            },
            3000,
            2048,
        ),
    ],
)
def test_an_upstreams_context_overflow_is_llmds_own(
    error: dict[str, object], prompt: int, context: int
) -> None:
    """So each protocol words it as its clients parse it (Anthropic's `prompt is too long`)."""
    remote = parse_record({"name": "far", "url": "http://h", "upstream_model": "m"})
    err = upstream_error(remote, 400, json.dumps({"error": error}), {})
    assert isinstance(err, ContextOverflow) and err.status == 400
    assert (err.prompt_tokens, err.context_length) == (prompt, context)
    assert "remote 'far'" in err.message
    said = anthropic_error(err)["error"]["message"]
    assert said == f"prompt is too long: {prompt} tokens > {context - 1} maximum"


def test_a_whole_completion_reads_as_one_chunk() -> None:
    whole = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    chunk = as_chunk(whole)
    [choice] = chunk["choices"]
    assert choice["finish_reason"] == "tool_calls" and "message" not in choice
    assert choice["delta"]["tool_calls"][0]["index"] == 0
    assert split_delta(choice["delta"], None) == [
        ({"tool_calls": choice["delta"]["tool_calls"]}, None)
    ]
    assert chunk["usage"] == whole["usage"]


def test_capabilities_are_read_in_llmds_words_from_either_shape() -> None:
    """Another llmd's dict, an Ollama-style list, or nothing (vLLM): unknown names dropped."""
    llmd_entry = {"id": "m", "capabilities": {"tools": True, "vision": False, "odd": True}}
    assert capabilities_of(llmd_entry) == {"tools": True, "vision": False}
    listed = {"id": "m", "capabilities": ["completion", "thinking", "embedding", "flying"]}
    assert capabilities_of(listed) == {"completion": True, "reasoning": True, "embeddings": True}
    assert capabilities_of({"id": "m", "max_model_len": 4096}) is None
    assert capabilities_of({"id": "m", "capabilities": ["flying"]}) is None
