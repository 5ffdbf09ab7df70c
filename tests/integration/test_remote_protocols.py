"""Remote models in every protocol (issue 27, phase 2): the official anthropic, openai
(Responses) and ollama clients ask the local daemon for `far`, a model that lives on a second
real `llmd serve`, and the same clients ask that upstream directly for its own model. Greedy,
both must give the same answer: the local daemon translates each protocol as it does for its
own models and forwards the translated request to the upstream's Chat Completions.

Also here: per-remote /metrics, count_tokens for an upstream without /tokenize (400), an
upstream killed mid-stream, a TLS upstream behind a private CA (--ca-bundle), a slow
upstream under 32 concurrent clients, and llama.cpp's llama-server as a second upstream
(skipped without the binary: set LLMD_LLAMA_SERVER or build it as bench/ does).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import pytest
from aiohttp import web
from openai import OpenAI

from tests.conftest import (
    LiveServer,
    free_port,
    run_llmd,
    serving,
    short_home,
    start_server,
    stop_server,
)
from tests.integration.test_remote_models import call

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

LOCAL_MODEL = "smollm2-135m"
GREEDY = {"temperature": 0}
SEA = [{"role": "user", "content": "Write two sentences about the sea."}]
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def upstream(model_path: Path) -> Iterator[LiveServer]:
    with serving() as live:
        yield live


@pytest.fixture(scope="module")
def local(upstream: LiveServer) -> Iterator[LiveServer]:
    """The daemon clients talk to; `far` is the upstream's model."""
    home = short_home()
    live = start_server(home)
    done = run_llmd(live.env, "remote", "add", "far", "--url", upstream.base_url)
    assert done.returncode == 0, done.stderr
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


def claude(server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def responses(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def both(local: LiveServer, upstream: LiveServer) -> list[tuple[LiveServer, str]]:
    """(server, model name): the remote through the local daemon, then the upstream itself."""
    return [(local, "far"), (upstream, LOCAL_MODEL)]


# ---------------------------------------------------------------------- Anthropic


def test_anthropic_answers_as_the_upstream_does(local: LiveServer, upstream: LiveServer) -> None:
    (mine, theirs) = [
        claude(s).messages.create(model=m, max_tokens=24, messages=SEA, extra_body=GREEDY)
        for s, m in both(local, upstream)
    ]
    assert mine.model == "far"
    assert mine.content[0].text == theirs.content[0].text  # type: ignore[union-attr]
    assert mine.stop_reason == theirs.stop_reason
    assert mine.usage.output_tokens == theirs.usage.output_tokens
    total = mine.usage.input_tokens + (mine.usage.cache_read_input_tokens or 0)
    assert total == theirs.usage.input_tokens + (theirs.usage.cache_read_input_tokens or 0)


def test_the_upstreams_prefix_cache_shows_as_anthropic_cache_reads(local: LiveServer) -> None:
    system = "You are a patient assistant who writes short, plain sentences. " * 6
    ask = dict(model="far", max_tokens=4, system=system, messages=SEA, extra_body=GREEDY)
    first = claude(local).messages.create(**ask)  # type: ignore[arg-type]
    again = claude(local).messages.create(**ask)  # type: ignore[arg-type]
    assert (again.usage.cache_read_input_tokens or 0) > 0
    whole = [u.input_tokens + (u.cache_read_input_tokens or 0) for u in (first.usage, again.usage)]
    assert whole[0] == whole[1]


def test_anthropic_streams_a_forced_tool_call_event_by_event(
    local: LiveServer, upstream: LiveServer
) -> None:
    finals, kinds = [], []
    for server, model in both(local, upstream):
        with claude(server).messages.stream(
            model=model,
            max_tokens=60,
            messages=PARIS,  # type: ignore[arg-type]
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
            extra_body=GREEDY,
        ) as stream:
            kinds.append([e.type for e in stream])
            finals.append(stream.get_final_message())
    mine, theirs = finals
    assert mine.stop_reason == theirs.stop_reason == "tool_use"
    [call_mine] = [b for b in mine.content if b.type == "tool_use"]
    [call_theirs] = [b for b in theirs.content if b.type == "tool_use"]
    assert call_mine.name == call_theirs.name == "get_weather"
    assert call_mine.input == call_theirs.input and set(call_mine.input) == {"city"}  # type: ignore[arg-type]
    assert call_mine.id.startswith("toolu_")
    assert kinds[0][:2] == ["message_start", "content_block_start"]
    assert kinds[0][-2:] == ["message_delta", "message_stop"]
    # The arguments arrive in fragments, as the upstream streamed them.
    assert kinds[0].count("input_json") > 1

    # The tool's answer goes back through the remote too.
    history: Any = [
        *PARIS,
        {"role": "assistant", "content": mine.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call_mine.id, "content": "Sunny, 24 C"}
            ],
        },
    ]
    again = claude(local).messages.create(
        model="far", max_tokens=24, messages=history, tools=[WEATHER], extra_body=GREEDY
    )
    assert again.content and again.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_anthropic_clients_read_a_remote_overflow_as_their_own(local: LiveServer) -> None:
    """Claude Code compacts its history on Anthropic's wording only, whoever ran out."""
    long = [{"role": "user", "content": "hi " * 20000}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(local).messages.create(model="far", max_tokens=8, messages=long)  # type: ignore[arg-type]
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert re.fullmatch(r"prompt is too long: \d+ tokens > \d+ maximum", message), message


def test_anthropic_count_tokens_needs_an_upstream_tokenizer(local: LiveServer) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(local).messages.count_tokens(model="far", messages=SEA)  # type: ignore[arg-type]
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "/tokenize" in body["error"]["message"]


# ---------------------------------------------------------------------- Responses


def test_responses_answer_and_chain_as_the_upstream_does(
    local: LiveServer, upstream: LiveServer
) -> None:
    texts = []
    for server, model in both(local, upstream):
        client = responses(server)
        first = client.responses.create(
            model=model, input="My name is Ada. Say hello.", max_output_tokens=16, temperature=0
        )
        events = list(
            client.responses.create(
                model=model,
                input="What is my name?",
                previous_response_id=first.id,
                max_output_tokens=16,
                temperature=0,
                stream=True,
            )
        )
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        second = events[-1].response  # type: ignore[union-attr]
        assert events[-1].type in ("response.completed", "response.incomplete")
        assert len(deltas) > 3 and "".join(deltas) == second.output_text
        texts.append((first.output_text, second.output_text, second.usage.input_tokens))
        if server is local:
            assert second.model == "far"
            # llmd keeps the chain: the stored response and its input are there to read.
            assert client.responses.retrieve(second.id).output_text == second.output_text
    assert texts[0] == texts[1]


def test_responses_function_calls_and_json_output_as_the_upstream_gives_them(
    local: LiveServer, upstream: LiveServer
) -> None:
    tool: Any = {
        "type": "function",
        "name": "get_weather",
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    fmt: Any = {
        "format": {
            "type": "json_schema",
            "name": "city",
            "schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    }
    calls, texts = [], []
    for server, model in both(local, upstream):
        client = responses(server)
        called = client.responses.create(
            model=model,
            input="What is the weather in Paris?",
            tools=[tool],
            tool_choice="required",
            max_output_tokens=40,
            temperature=0,
        )
        [call] = [i for i in called.output if i.type == "function_call"]
        calls.append((call.name, json.loads(call.arguments)))  # type: ignore[union-attr]
        shaped = client.responses.create(
            model=model, input="Name a city.", text=fmt, max_output_tokens=30, temperature=0
        )
        texts.append(shaped.output_text)
    assert calls[0] == calls[1] and calls[0][0] == "get_weather"
    assert texts[0] == texts[1] and set(json.loads(texts[0])) == {"city"}


def test_responses_custom_tools_with_a_grammar_are_refused_for_a_remote(local: LiveServer) -> None:
    tool = {
        "type": "custom",
        "name": "edit",
        "format": {"type": "grammar", "syntax": "regex", "definition": "(add|remove) [a-z]+"},
    }
    status, err, _ = call(
        local, "POST", "/v1/responses", {"model": "far", "input": "hi", "tools": [tool]}
    )
    assert status == 400 and err["error"]["param"] == "tools"
    assert "remote model" in err["error"]["message"]


# ---------------------------------------------------------------------- Ollama


def test_ollama_chat_and_generate_answer_as_the_upstream_does(
    local: LiveServer, upstream: LiveServer
) -> None:
    answers = []
    for server, model in both(local, upstream):
        client = ollama.Client(host=server.base_url)
        options = {"temperature": 0, "num_predict": 24}
        chat = client.chat(model=model, messages=SEA, options=options)
        streamed = "".join(
            part.message.content or ""
            for part in client.chat(model=model, messages=SEA, options=options, stream=True)
        )
        generated = client.generate(model=model, prompt=SEA[0]["content"], options=options)
        answers.append((chat.message.content, streamed, generated.response, chat.eval_count))
    assert answers[0] == answers[1]
    assert answers[0][0] == answers[0][1]


def test_ollama_structured_output_and_logprobs_come_back(
    local: LiveServer, upstream: LiveServer
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    got = []
    for server, model in both(local, upstream):
        client = ollama.Client(host=server.base_url)
        answer = client.chat(
            model=model,
            messages=[{"role": "user", "content": "Invent a person."}],
            format=schema,
            options={"temperature": 0, "num_predict": 40},
            logprobs=True,
            top_logprobs=2,
        )
        got.append(answer)
    mine, theirs = got
    assert mine.message.content == theirs.message.content
    assert set(json.loads(mine.message.content)) == {"name", "age"}
    assert len(mine.logprobs) == len(theirs.logprobs) == mine.eval_count
    assert [lp.token for lp in mine.logprobs] == [lp.token for lp in theirs.logprobs]
    assert len(mine.logprobs[0].top_logprobs) == 2


def test_ollama_raw_and_fill_in_the_middle_answer_as_the_upstream_does(
    local: LiveServer, upstream: LiveServer
) -> None:
    """Raw prompts (and `suffix`) go to the upstream's /v1/completions as given."""
    options = {"temperature": 0, "num_predict": 16}
    raw, fim = [], []
    for server, model in both(local, upstream):
        client = ollama.Client(host=server.base_url)
        raw.append(client.generate(model=model, prompt="The sea is", raw=True, options=options))
        # The test model has no fill-in-the-middle tokens: the upstream's refusal comes back.
        with pytest.raises(ollama.ResponseError) as caught:
            client.generate(model=model, prompt="def add(a, b):", suffix="\n", options=options)
        fim.append(caught.value)
    assert raw[0].response == raw[1].response and raw[0].response.strip()
    assert raw[0].eval_count == raw[1].eval_count
    assert fim[0].status_code == fim[1].status_code == 400
    assert fim[1].error in fim[0].error and "remote 'far'" in fim[0].error


def test_ollama_show_says_where_a_remote_lives_and_its_context(
    local: LiveServer, upstream: LiveServer
) -> None:
    shown = ollama.Client(host=local.base_url).show("far:latest")
    _, theirs, _ = call(upstream, "GET", f"/v1/models/{LOCAL_MODEL}")
    assert shown.details.format == "remote"  # type: ignore[union-attr]
    assert shown.modelinfo["remote.context_length"] == theirs["max_model_len"]  # type: ignore[index]
    assert "completion" in (shown.capabilities or [])
    assert f"num_ctx                        {theirs['max_model_len']}" == shown.parameters


# ---------------------------------------------------------------------- where requests go


def test_no_request_body_can_send_llmd_elsewhere(local: LiveServer) -> None:
    """A remote's URL comes from its record only: fields that name another server are
    refused as unknown parameters in every protocol, and a URL as the model is no model."""
    elsewhere = "http://127.0.0.1:9/v1"
    hello = [{"role": "user", "content": "hi"}]
    cases = [
        ("/v1/chat/completions", {"model": "far", "messages": hello, "base_url": elsewhere}),
        ("/v1/messages", {"model": "far", "max_tokens": 4, "messages": hello, "url": elsewhere}),
        ("/v1/responses", {"model": "far", "input": "hi", "api_base": elsewhere}),
        ("/api/chat", {"model": "far", "messages": hello, "host": elsewhere}),
    ]
    for path, body in cases:
        status, err, _ = call(local, "POST", path, body)
        assert status == 400, (path, err)
    status, _, _ = call(
        local, "POST", "/v1/chat/completions", {"model": elsewhere, "messages": hello}
    )
    assert status == 404


# ---------------------------------------------------------------------- metrics


def _metric(server: LiveServer, name: str, **labels: str) -> float:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(p in line for p in want.split(",")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_count_each_remotes_requests_tokens_and_errors(local: LiveServer) -> None:
    before = _metric(local, "llmd_remote_requests_total", remote="far", outcome="ok")
    tokens = _metric(local, "llmd_remote_generated_tokens_total", remote="far")
    msg = claude(local).messages.create(model="far", max_tokens=8, messages=SEA, extra_body=GREEDY)
    responses(local).chat.completions.create(model="far", messages=SEA, max_tokens=8)  # type: ignore[arg-type]
    assert _metric(local, "llmd_remote_requests_total", remote="far", outcome="ok") == before + 2
    after = _metric(local, "llmd_remote_generated_tokens_total", remote="far")
    assert after >= tokens + msg.usage.output_tokens
    assert _metric(local, "llmd_remote_request_duration_seconds_count", remote="far") >= 2
    errors = _metric(local, "llmd_remote_errors_total", remote="far")
    status, _, _ = call(
        local, "POST", "/v1/completions", {"model": "far", "prompt": "hi " * 20000, "max_tokens": 4}
    )
    assert status == 400
    assert _metric(local, "llmd_remote_errors_total", remote="far", status="400") >= 1
    assert _metric(local, "llmd_remote_errors_total", remote="far") == errors + 1
    for _ in range(100):  # the first health check runs as the daemon starts
        if _metric(local, "llmd_remote_up", remote="far") == 1:
            break
        time.sleep(0.2)
    assert _metric(local, "llmd_remote_up", remote="far") == 1
    assert _metric(local, "llmd_remote_in_flight", remote="far") == 0


# ---------------------------------------------------------------------- failures


def test_an_upstream_killed_mid_stream_ends_the_clients_stream_cleanly(
    local: LiveServer, model_path: Path
) -> None:
    home = short_home()
    doomed = start_server(home)
    try:
        done = run_llmd(local.env, "remote", "add", "doomed", "--url", doomed.base_url)
        assert done.returncode == 0, done.stderr
        seen: list[str] = []
        with pytest.raises(anthropic.APIError):  # noqa: PT012 - the error comes mid-iteration
            with claude(local).messages.stream(
                model="doomed",
                max_tokens=2000,
                messages=[{"role": "user", "content": "Count from one to one thousand."}],
                extra_body=GREEDY,
            ) as stream:
                for event in stream:
                    seen.append(event.type)
                    if event.type == "content_block_delta" and len(seen) > 5:
                        doomed.proc.kill()
        assert "message_start" in seen and "message_stop" not in seen
    finally:
        stop_server(doomed)
        shutil.rmtree(home, ignore_errors=True)
        run_llmd(local.env, "remote", "rm", "doomed")
    # The daemon is fine: other requests for other remotes and local models still answer.
    assert claude(local).messages.create(model="far", max_tokens=4, messages=SEA).content


# ---------------------------------------------------------------------- TLS


class SlowUpstream:
    """A minimal OpenAI-shaped server in a thread: `/v1/models` lists `slow`, each chat request
    streams a short answer after `delay` seconds (counting how many run at once); with
    `tls`, it serves https with that context. A test server on purpose: what is checked is
    llmd's side (certificate checks, how many requests it lets through), not an engine."""

    def __init__(self, delay: float = 0.0, tls: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.delay = delay
        self.tls = tls
        self.in_flight = 0
        self.most = 0
        self.served = 0
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(10)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self.tls)
        self.loop.run_until_complete(site.start())
        started.set()
        self.loop.run_forever()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "slow", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for chunk in (
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
            ):
                await resp.write(f"data: {json.dumps({'model': 'slow', **chunk})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            self.served += 1
            return resp
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def _private_ca(where: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 it signed, made with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=where)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
        "-keyout", "ca.key", "-out", "ca.pem",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "server.key", "-out", "server.csr",
    )  # fmt: skip
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem",
    )  # fmt: skip
    return where / "ca.pem", where / "server.pem", where / "server.key"


def test_a_tls_upstream_is_verified_against_the_remotes_ca_bundle(
    local: LiveServer, tmp_path: Path
) -> None:
    ca, cert, key = _private_ca(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = SlowUpstream(tls=tls)
    try:
        # The system's CAs do not know this one: refused, saying why.
        done = run_llmd(local.env, "remote", "add", "private", "--url", server.url)
        assert done.returncode != 0 and "certificate" in done.stderr.lower(), done.stderr
        done = run_llmd(
            local.env, "remote", "add", "private", "--url", server.url, "--ca-bundle", str(ca)
        )
        assert done.returncode == 0, done.stderr
        _, listed, _ = call(local, "GET", "/v1/remotes")
        assert next(r for r in listed["data"] if r["name"] == "private")["ca_bundle"] == str(ca)
        answer = claude(local).messages.create(model="private", max_tokens=4, messages=SEA)
        assert answer.content[0].text == "ok"  # type: ignore[union-attr]
    finally:
        run_llmd(local.env, "remote", "rm", "private")
        server.close()


# ---------------------------------------------------------------------- load


def test_a_slow_upstream_under_32_clients_is_bounded_and_loses_nothing(
    local: LiveServer,
) -> None:
    server = SlowUpstream(delay=0.5)
    try:
        done = run_llmd(
            local.env, "remote", "add", "slow", "--url", server.url,
            "--max-concurrency", "4", "--queue-timeout", "1.2",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        results: list[tuple[int, Any, dict[str, str]]] = []
        lock = threading.Lock()

        def ask(i: int) -> None:
            # Half Anthropic, half Ollama: each protocol's client sees its own 429.
            if i % 2:
                body = {"model": "slow", "max_tokens": 4, "messages": SEA}
                got = call(local, "POST", "/v1/messages", body)
            else:
                got = call(
                    local, "POST", "/api/chat", {"model": "slow", "messages": SEA, "stream": False}
                )
            with lock:
                results.append((i, *got[:2], got[2]))  # type: ignore[arg-type]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(32)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - started
    finally:
        run_llmd(local.env, "remote", "rm", "slow")
        server.close()
    assert len(results) == 32  # every client got an answer
    assert server.most == 4  # never more in flight than the bound
    ok = [r for r in results if r[1] == 200]
    busy = [r for r in results if r[1] == 429]
    assert len(ok) + len(busy) == 32 and ok and busy
    assert server.served == len(ok)  # each 200 is one upstream answer, nothing dropped
    # Four at a time for 1.2 s of queueing: about 4 + 4 * 1.2 / 0.5 answered, the rest busy.
    assert 8 <= len(ok) <= 20, (len(ok), elapsed)
    counted = _metric(local, "llmd_remote_errors_total", remote="slow", status="429")
    assert counted == len(busy)  # each refusal counted on /metrics
    for i, _, body, headers in busy:
        assert headers.get("Retry-After")
        if i % 2:
            assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        else:
            assert "slot" in body["error"]


# ---------------------------------------------------------------------- llama-server


def _llama_server() -> Path | None:
    """llama.cpp's server: $LLMD_LLAMA_SERVER, the one bench/ builds, or one on PATH."""
    candidates = [
        os.environ.get("LLMD_LLAMA_SERVER"),
        str(Path(__file__).parents[2] / "bench" / ".llamacpp" / "build" / "bin" / "llama-server"),
        shutil.which("llama-server"),
    ]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    return None


@pytest.fixture(scope="module")
def llama_server(model_path: Path) -> Iterator[str]:
    binary = _llama_server()
    if binary is None:
        pytest.skip("llama-server is not built (set LLMD_LLAMA_SERVER)")
    port = free_port()
    log = open(short_home() / "llama-server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(binary), "-m", str(model_path), "--port", str(port), "-c", "2048", "--jinja"]
        + ["-np", "2", "--alias", "smollm"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not start: see {log.name}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def test_llama_server_as_a_second_upstream(local: LiveServer, llama_server: str) -> None:
    done = run_llmd(local.env, "remote", "add", "llama", "--url", llama_server)
    assert done.returncode == 0, done.stderr
    try:
        _, listed, _ = call(local, "GET", "/v1/models/llama")
        with urllib.request.urlopen(llama_server + "/v1/models", timeout=30) as r:
            [entry] = json.loads(r.read())["data"]
        # As llama-server reports it: each of its 2 slots gets half of -c 2048.
        assert listed["max_model_len"] == entry["meta"]["n_ctx"] == 1024
        theirs = OpenAI(base_url=llama_server + "/v1", api_key="unused").chat.completions.create(
            model="smollm",
            messages=SEA,
            temperature=0,
            max_tokens=24,  # type: ignore[arg-type]
        )
        mine = claude(local).messages.create(
            model="llama", max_tokens=24, messages=SEA, extra_body=GREEDY
        )
        assert mine.content[0].text == (theirs.choices[0].message.content or "").lstrip()  # type: ignore[union-attr]
        assert mine.usage.output_tokens == theirs.usage.completion_tokens  # type: ignore[union-attr]
        # llama-server renders and tokenizes: count_tokens works through it.
        counted = claude(local).messages.count_tokens(model="llama", messages=SEA)  # type: ignore[arg-type]
        assert counted.input_tokens == theirs.usage.prompt_tokens  # type: ignore[union-attr]
        streamed = "".join(
            part.message.content or ""
            for part in ollama.Client(host=local.base_url).chat(
                model="llama", messages=SEA, options={"temperature": 0, "num_predict": 24},
                stream=True,
            )
        )  # fmt: skip
        assert streamed == theirs.choices[0].message.content
    finally:
        run_llmd(local.env, "remote", "rm", "llama")
