"""The OpenAI API through the real HTTP server, the real worker and the real model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from openai import OpenAI

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

CAPITAL = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(server, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        server.base_url + path,
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_capital_of_france_answers_paris(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": CAPITAL}], temperature=0
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 20 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_equals_non_streaming_and_reports_usage(client: OpenAI) -> None:
    msgs = [{"role": "user", "content": "Write two sentences about the sea."}]
    full = client.chat.completions.create(
        model="smollm2-135m", messages=msgs, temperature=0, max_tokens=40
    )
    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=msgs,
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert "".join(parts) == full.choices[0].message.content
    assert reasons == [full.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_multibyte_stream_never_splits_characters(client: OpenAI) -> None:
    msgs = [{"role": "user", "content": "请用中文介绍一下长城。🙂"}]
    stream = client.chat.completions.create(
        model="smollm2-135m", messages=msgs, temperature=0, max_tokens=60, stream=True
    )
    deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
    text = "".join(deltas)
    assert text and all("\ufffd" not in d for d in deltas)
    full = client.chat.completions.create(
        model="smollm2-135m", messages=msgs, temperature=0, max_tokens=60
    )
    assert text == full.choices[0].message.content


def test_max_tokens_ends_with_length(client: OpenAI) -> None:
    r = client.completions.create(
        model="smollm2-135m", prompt="Once upon a time", max_tokens=5, temperature=0
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_stop_string_is_honoured_across_tokens(client: OpenAI) -> None:
    prompt = "1, 2, 3, 4, 5,"
    free = client.completions.create(
        model="smollm2-135m", prompt=prompt, max_tokens=20, temperature=0
    )
    assert " 8" in free.choices[0].text  # the model counts on: the stop below has work to do
    stopped = client.completions.create(
        model="smollm2-135m", prompt=prompt, max_tokens=20, temperature=0, stop=[" 8"]
    )
    text = stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    assert " 8" not in text and text == free.choices[0].text.split(" 8")[0]


def test_completions_stream(client: OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="smollm2-135m", prompt="The sky is", max_tokens=8, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ref = client.completions.create(
        model="smollm2-135m", prompt="The sky is", max_tokens=8, temperature=0
    )
    assert text == ref.choices[0].text


def test_seed_makes_sampling_repeatable(client: OpenAI) -> None:
    def ask(seed: int) -> str:
        r = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "Tell me a short story."}],
            temperature=1.0,
            seed=seed,
            max_tokens=30,
        )
        return r.choices[0].message.content

    assert ask(42) == ask(42)
    assert len({ask(s) for s in (1, 2, 3)}) > 1


@pytest.mark.parametrize(
    "body,status,param,code",
    [
        (
            {
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 5,
            },
            400,
            "temperature",
            None,
        ),
        ({"model": "smollm2-135m", "messages": []}, 400, "messages", None),
        (
            {
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            400,
            "tool_choice",
            None,
        ),
        (
            {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "bogus": 1},
            400,
            "bogus",
            "unknown_parameter",
        ),
        (
            {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "n": 17},
            400,
            "n",
            None,
        ),
        (
            {
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "word " * 9000}],
                "max_tokens": 10,
            },
            400,
            "messages",
            "context_length_exceeded",
        ),
        (
            {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
            404,
            "model",
            "model_not_found",
        ),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model", None),
    ],
)
def test_bad_requests_get_openai_error_envelopes(server, body, status, param, code) -> None:  # type: ignore[no-untyped-def]
    got, payload = post(server, "/v1/chat/completions", body)
    assert got == status
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if code:
        assert err["code"] == code


def test_not_installed_model_message_says_how_to_get_it(server) -> None:  # type: ignore[no-untyped-def]
    status, payload = post(
        server,
        "/v1/chat/completions",
        {"model": "smollm2-360m", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404
    message = payload["error"]["message"]
    assert "Download it with `llmd pull smollm2-360m`" in message


def test_malformed_json_and_oversized_bodies_are_rejected_then_serving_continues(
    server, client
) -> None:  # type: ignore[no-untyped-def]
    status, payload = post(server, "/v1/chat/completions", b"{not json")
    assert status == 400 and "JSON" in payload["error"]["message"]
    big = b'{"model": "smollm2-135m", "prompt": "' + b"a" * (17 * 1024 * 1024) + b'"}'
    try:
        status, payload = post(server, "/v1/completions", big)
        assert status == 413 and payload["error"]["code"] == "request_too_large"
    except (ConnectionResetError, BrokenPipeError, urllib.error.URLError):
        pass  # the server may close the connection while the client still uploads
    r = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": CAPITAL}], temperature=0
    )
    assert "Paris" in r.choices[0].message.content


def test_models_list_contains_default(client: OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert "smollm2-135m" in ids


def get(server, path: str) -> dict:  # type: ignore[no-untyped-def]
    with urllib.request.urlopen(server.base_url + path, timeout=60) as r:
        return json.loads(r.read())


def test_a_storm_of_disconnecting_streams_leaks_no_sequence_or_kv(server) -> None:  # type: ignore[no-untyped-def]
    """20 streaming clients that hang up after their first chunk: the worker cancels every
    sequence, releases its KV (only idle prefix-cache blocks remain), and keeps answering."""
    import http.client
    import time
    from urllib.parse import urlparse

    url = urlparse(server.base_url)
    body = json.dumps(
        {
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
            "max_tokens": 400,
            "stream": True,
        }
    )
    for _ in range(20):
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.readline()  # the stream has started
        conn.close()  # the client goes away mid-generation
    deadline = time.monotonic() + 60
    while True:
        [model] = [m for m in get(server, "/status")["models"] if m["name"] == "smollm2-135m"]
        engine = model["engine"]
        idle = engine["active_sequences"] == 0 and engine["queued_requests"] == 0
        if (idle and model["in_flight"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert model["in_flight"] == 0
    assert engine["active_sequences"] == 0 and engine["queued_requests"] == 0
    assert engine["kv_blocks_used"] == engine["pinned_blocks"] == 0  # nothing held but cache
    assert engine["tokens_generated"] < 20 * 400  # they were cut short, not run to the end
    assert model["backend"] and model["kv_budget_bytes"] > 0
    status, _ = post(
        server,
        "/v1/chat/completions",
        {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert status == 200


def test_max_tokens_past_the_context_is_clamped_not_refused(server) -> None:  # type: ignore[no-untyped-def]
    """Agents ask for 32000 tokens whatever the model: the request runs; only its prompt has
    to fit. The prompt too long gets OpenAI's wording, which clients parse."""
    got, payload = post(
        server,
        "/v1/chat/completions",
        {
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100000,
            "stop": [" "],
            "temperature": 0,
        },
    )
    assert got == 200 and payload["choices"][0]["finish_reason"] == "stop"
    got, payload = post(
        server,
        "/v1/chat/completions",
        {"model": "smollm2-135m", "messages": [{"role": "user", "content": "word " * 9000}]},
    )
    assert got == 400
    assert payload["error"]["message"].startswith("This model's maximum context length is 8192")
