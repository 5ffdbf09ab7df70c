"""Remote models (issue 27, phase 1) against a real upstream: a second `llmd serve` with the
test model, reached through a local daemon where `llmd remote add` registered it. The
official `openai` client asks the local daemon for the remote model and the upstream
directly, greedy, and both must give the same text.

What llmd sends upstream (the key header, never the client's own headers, never more
requests at once than the bound) is checked against `Recorder`, a small aiohttp server in
this process that records every request: a test server on purpose, since what it checks is
llmd's side of the wire, which no real engine reports.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from openai import APIError, OpenAI

from tests.conftest import (
    LiveServer,
    free_port,
    run_llmd,
    serving,
    short_home,
    start_server,
    stop_server,
)

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

LOCAL_MODEL = "smollm2-135m"
KEY_VAR = "LLMD_TEST_REMOTE_KEY"
KEY = "sk-test-4f2a9c1e-secret"
SEA = [{"role": "user", "content": "Write two sentences about the sea."}]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("llmd", timeout=120)
        self.unix_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def call_unix(server: LiveServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A request over the daemon's Unix socket, as the CLI sends them."""
    conn = _UnixConnection(server.home / "run" / "llmd.sock")
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def call(
    server: LiveServer, method: str, path: str, body: Any = None
) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.base_url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


# ---------------------------------------------------------------------- the recorder


class Recorder:
    """An OpenAI-shaped server in a thread that records what it is sent. Its answer depends
    on the last user message: "hold" waits until `release`, "unauthorized" answers 401
    quoting the key it got (as some providers do), "forever" streams until the client goes
    away, "silent" never answers; anything else gets a short canned answer."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.disconnected = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._release: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._started.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def release(self) -> None:
        """Let every held request answer; later ones hold again."""

        def swap() -> None:
            held, self._release = self._release, asyncio.Event()
            held.set()  # type: ignore[union-attr]

        self.loop.call_soon_threadsafe(swap)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._started.set()
        self.loop.run_forever()

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append({"path": request.path, "headers": dict(request.headers)})
        return web.json_response(
            {"object": "list", "data": [{"id": "rec", "object": "model", "max_model_len": 4096}]}
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        what = body["messages"][-1]["content"]
        if isinstance(what, list):  # text parts (as the Anthropic translation sends them)
            what = "".join(part.get("text", "") for part in what)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if what == "hold":
                await self._release.wait()  # type: ignore[union-attr]
            elif what == "silent":
                await asyncio.sleep(3600)
            elif what == "unauthorized":
                auth = request.headers.get("Authorization", "")
                return web.json_response(
                    {
                        "error": {
                            "message": f"Incorrect API key provided: {auth}",
                            "code": "bad_key",
                        }
                    },
                    status=401,
                )
            elif what == "break":  # two events, then the connection drops mid-stream
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                for _ in range(2):
                    chunk = {"model": "rec", "choices": [{"index": 0, "delta": {"content": "x"}}]}
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                assert request.transport is not None
                request.transport.close()
                return resp
            elif what == "forever":
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                try:
                    while True:
                        chunk = {
                            "model": "rec",
                            "choices": [{"index": 0, "delta": {"content": "x"}}],
                        }
                        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        await asyncio.sleep(0.05)
                except (ConnectionResetError, asyncio.CancelledError):
                    self.disconnected.set()
                    raise
            return web.json_response(
                {
                    "id": "chatcmpl-rec",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "rec",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "recorded"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def upstream(model_path: Path) -> Iterator[LiveServer]:
    with serving() as live:
        yield live


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.close()


@pytest.fixture(scope="module")
def local(upstream: LiveServer, recorder: Recorder) -> Iterator[LiveServer]:
    """The daemon clients talk to, with the key variable in its environment, and remotes:
    `far` (the upstream llmd), `rec` (the recorder, with the key), `rec-pair` (two at a
    time), `rec-tight` (one at a time, a short queue), `rec-slow` (a short read timeout)."""
    home = short_home()
    os.environ[KEY_VAR] = KEY
    try:
        live = start_server(home)
    finally:
        del os.environ[KEY_VAR]
    env = live.env
    adds = [
        ["far", "--url", upstream.base_url + "/v1", "--model", LOCAL_MODEL],
        ["rec", "--url", recorder.url, "--model", "rec", "--api-key-env", KEY_VAR],
        ["rec-pair", "--url", recorder.url, "--model", "rec", "--max-concurrency", "2"],
        ["rec-tight", "--url", recorder.url, "--model", "rec", "--max-concurrency", "1"]
        + ["--queue-timeout", "0.5"],
        ["rec-slow", "--url", recorder.url, "--model", "rec", "--read-timeout", "1"],
    ]
    for args in adds:
        extra = {KEY_VAR: KEY} if KEY_VAR in args else {}
        done = run_llmd({**env, **extra}, "remote", "add", *args)
        assert done.returncode == 0, done.stderr
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


def openai(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


# ---------------------------------------------------------------------- listing and managing


def test_remote_is_listed_with_its_owner_and_the_upstreams_context(
    local: LiveServer, upstream: LiveServer
) -> None:
    _, theirs, _ = call(upstream, "GET", f"/v1/models/{LOCAL_MODEL}")
    _, listed, _ = call(local, "GET", "/v1/models")
    far = next(m for m in listed["data"] if m["id"] == "far")
    assert far["owned_by"] == f"127.0.0.1:{upstream.port}"
    assert far["max_model_len"] == theirs["max_model_len"] and far["max_model_len"] > 0
    # Capabilities as the upstream reports them; none where it does not (the recorder, like
    # vLLM, lists bare ids).
    assert far["capabilities"] == theirs["capabilities"] and far["capabilities"]["tools"]
    assert next(m for m in listed["data"] if m["id"] == "rec")["capabilities"] is None
    _, show, _ = call(local, "POST", "/api/show", {"model": "far"})
    assert "completion" in show["capabilities"] and "embedding" not in show["capabilities"]
    assert any(m["id"] == LOCAL_MODEL for m in listed["data"])  # local models stay listed
    _, one, _ = call(local, "GET", "/v1/models/far")
    assert one["id"] == "far"
    _, tags, _ = call(local, "GET", "/api/tags")
    assert "far" in [m["name"] for m in tags["models"]]
    shown = run_llmd(local.env, "remote", "list")
    assert "far" in shown.stdout and upstream.base_url in shown.stdout
    _wait_for(lambda: _remote_status(local, "far")["healthy"] is True, "a health check")
    status = run_llmd(local.env, "status")
    assert "remote far:" in status.stdout


def test_key_is_sent_upstream_but_never_stored_or_shown(
    local: LiveServer, recorder: Recorder
) -> None:
    before = len(recorder.requests)
    answer = (
        openai(local)
        .chat.completions.create(model="rec", messages=[{"role": "user", "content": "hi"}])
        .choices[0]
        .message.content
    )
    assert answer == "recorded"
    # Other remotes on this recorder (an earlier test's "far") health-check its /models at any
    # time: the chat request is the one sent to /chat/completions.
    sent = next(r for r in recorder.requests[before:] if r["path"].endswith("/chat/completions"))
    assert sent["headers"]["Authorization"] == f"Bearer {KEY}"
    assert sent["body"]["model"] == "rec"
    # The add-time probe sent it too; the client's own key ("unused") never travels on.
    assert all("unused" not in str(r["headers"]) for r in recorder.requests)
    for f in local.home.rglob("*"):
        if f.is_file() and f.suffix != ".sock":
            assert KEY not in f.read_text(errors="replace"), f
    _, listed, _ = call(local, "GET", "/v1/remotes")
    assert KEY not in json.dumps(listed)
    rec = next(r for r in listed["data"] if r["name"] == "rec")
    assert rec["api_key_env"] == KEY_VAR
    # An upstream error quoting the key comes back with the key blanked out.
    status, err, _ = call(
        local,
        "POST",
        "/v1/chat/completions",
        {"model": "rec", "messages": [{"role": "user", "content": "unauthorized"}]},
    )
    assert status == 401 and KEY not in json.dumps(err)
    assert "Incorrect API key" in err["error"]["message"]


def test_names_urls_and_unreachable_upstreams_are_refused_clearly(local: LiveServer) -> None:
    cases = [
        (["smollm2-135m", "--url", "http://127.0.0.1:1"], "already a local model"),
        (["far", "--url", "http://127.0.0.1:1"], "exists"),
        (["x", "--url", "ftp://example.com"], "http"),
        (["x", "--url", "http://user:pw@example.com"], "credentials"),
        (["x", "--url", f"http://127.0.0.1:{free_port()}"], "cannot reach"),
    ]
    for args, said in cases:
        done = run_llmd(local.env, "remote", "add", *args)
        assert done.returncode != 0 and said in done.stderr, (args, done.stderr)


def test_add_and_remove_over_http_on_the_unix_socket_only(
    local: LiveServer, upstream: LiveServer
) -> None:
    far2 = {"name": "far2", "url": upstream.base_url}
    # Over TCP, changing where a name's requests go is refused: another local user could
    # take over a model name, or have the daemon send its environment anywhere.
    status, err, _ = call(local, "POST", "/v1/remotes", {**far2, "api_key_env": "HOME"})
    assert status == 403 and err["error"]["code"] == "unix_socket_only"
    status, _, _ = call(local, "DELETE", "/v1/remotes/far")
    assert status == 403
    status, added = call_unix(local, "POST", "/v1/remotes", far2)
    assert status == 201 and added["upstream_model"] == LOCAL_MODEL  # its only model
    status, _ = call_unix(local, "POST", "/v1/remotes", far2)
    assert status == 409
    _, listed, _ = call(local, "GET", "/v1/remotes")  # listing holds no secret: open on TCP
    assert "far2" in [r["name"] for r in listed["data"]]
    status, _ = call_unix(local, "DELETE", "/v1/remotes/far2")
    assert status == 200
    _, listed, _ = call(local, "GET", "/v1/models")
    assert "far2" not in [m["id"] for m in listed["data"]]
    status, err = call_unix(local, "DELETE", "/v1/remotes/far2")
    assert status == 404 and "far2" in err["error"]["message"]


# ---------------------------------------------------------------------- generation


def test_chat_answers_as_the_upstream_does(local: LiveServer, upstream: LiveServer) -> None:
    mine = openai(local).chat.completions.create(
        model="far", messages=SEA, temperature=0, max_tokens=24
    )
    theirs = openai(upstream).chat.completions.create(
        model=LOCAL_MODEL, messages=SEA, temperature=0, max_tokens=24
    )
    assert mine.model == "far"
    assert mine.choices[0].message.content == theirs.choices[0].message.content
    assert mine.usage.completion_tokens == theirs.usage.completion_tokens


def test_streamed_chat_is_relayed_event_by_event(local: LiveServer, upstream: LiveServer) -> None:
    whole = openai(upstream).chat.completions.create(
        model=LOCAL_MODEL, messages=SEA, temperature=0, max_tokens=24
    )
    stream = openai(local).chat.completions.create(
        model="far",
        messages=SEA,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len(chunks) > 3 and {c.model for c in chunks} == {"far"}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    ran = run_llmd(local.env, "run", "far", SEA[0]["content"], "--max-tokens", "24")
    assert ran.returncode == 0 and ran.stdout.strip() == text.strip()


def test_completions_streamed_and_not(local: LiveServer, upstream: LiveServer) -> None:
    prompt = "The three primary colors are"
    theirs = openai(upstream).completions.create(
        model=LOCAL_MODEL, prompt=prompt, temperature=0, max_tokens=16
    )
    mine = openai(local).completions.create(
        model="far", prompt=prompt, temperature=0, max_tokens=16
    )
    assert mine.model == "far" and mine.choices[0].text == theirs.choices[0].text
    stream = openai(local).completions.create(
        model="far", prompt=prompt, temperature=0, max_tokens=16, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == theirs.choices[0].text


def test_requests_are_validated_before_they_leave(local: LiveServer, recorder: Recorder) -> None:
    before = len(recorder.requests)
    for body, param in [
        ({"temperature": 7}, "temperature"),
        ({"frobnicate": True}, "frobnicate"),
    ]:
        status, err, _ = call(
            local,
            "POST",
            "/v1/chat/completions",
            {"model": "rec", "messages": [{"role": "user", "content": "hi"}], **body},
        )
        assert status == 400 and err["error"]["param"] == param
    assert len(recorder.requests) == before  # nothing reached the upstream


def test_an_upstream_refusal_keeps_its_status_and_says_why(
    local: LiveServer, upstream: LiveServer
) -> None:
    body = {"prompt": "hi " * 20000, "max_tokens": 4}  # far beyond the test model's context
    theirs, their_err, _ = call(upstream, "POST", "/v1/completions", {"model": LOCAL_MODEL, **body})
    mine, my_err, _ = call(local, "POST", "/v1/completions", {"model": "far", **body})
    assert 400 <= theirs < 500 and mine == theirs
    assert their_err["error"]["message"] in my_err["error"]["message"]
    assert "remote 'far'" in my_err["error"]["message"]


def test_protocols_without_a_remote_counterpart_say_so(local: LiveServer) -> None:
    """Generation protocols forward remote models (test_remote_protocols.py), and so do
    OpenAI's embeddings and rerank (test_remote_embeddings.py); Ollama's embed routes and
    /infill need the model here: a 400 in each protocol's own shape, saying where it works."""
    status, err, _ = call(local, "POST", "/api/embed", {"model": "far:latest", "input": "hi"})
    assert status == 400 and "remote model" in err["error"]
    assert "/v1/embeddings" in err["error"]  # where remote embeddings are served
    status, err, _ = call(local, "POST", "/infill", {"model": "far", "input_prefix": "x"})
    assert status == 400 and "remote model" in err["error"]["message"]


# ---------------------------------------------------------------------- limits and failures


def _post_in_thread(
    server: LiveServer, model: str, content: str, out: list[int]
) -> threading.Thread:
    def go() -> None:
        status, _, _ = call(
            server,
            "POST",
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": content}]},
        )
        out.append(status)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def _wait_for(predicate: Any, what: str) -> None:
    for _ in range(600):
        if predicate():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"never happened: {what}")


def _remote_status(local: LiveServer, name: str) -> dict[str, Any]:
    _, info, _ = call(local, "GET", "/status")
    return next(r for r in info["remotes"] if r["name"] == name)


def test_in_flight_requests_are_bounded_per_remote(local: LiveServer, recorder: Recorder) -> None:
    recorder.most_in_flight = 0
    statuses: list[int] = []
    threads = [_post_in_thread(local, "rec-pair", "hold", statuses) for _ in range(3)]
    _wait_for(lambda: _remote_status(local, "rec-pair")["queued"] == 1, "a third request queued")
    _wait_for(lambda: recorder.in_flight == 2, "two requests upstream")
    assert recorder.most_in_flight == 2
    recorder.release()  # the two answer; the queued one goes upstream and holds in turn
    _wait_for(lambda: len(statuses) == 2 and recorder.in_flight == 1, "the third upstream")
    recorder.release()
    for t in threads:
        t.join(60)
    assert statuses == [200, 200, 200] and recorder.most_in_flight == 2


def test_a_full_remote_answers_429_after_its_queue_timeout(
    local: LiveServer, recorder: Recorder
) -> None:
    statuses: list[int] = []
    holder = _post_in_thread(local, "rec-tight", "hold", statuses)
    _wait_for(lambda: _remote_status(local, "rec-tight")["in_flight"] == 1, "one in flight")
    status, err, headers = call(
        local,
        "POST",
        "/v1/chat/completions",
        {"model": "rec-tight", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 429 and err["error"]["code"] == "remote_busy" and headers["Retry-After"]
    recorder.release()
    holder.join(60)
    assert statuses == [200]


def test_a_silent_upstream_is_a_504(local: LiveServer) -> None:
    status, err, _ = call(
        local,
        "POST",
        "/v1/chat/completions",
        {"model": "rec-slow", "messages": [{"role": "user", "content": "silent"}]},
    )
    assert status == 504 and err["error"]["type"] == "server_error"


def test_a_client_going_away_cancels_the_upstream_request(
    local: LiveServer, recorder: Recorder
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", local.port, timeout=60)
    body = {"model": "rec", "stream": True, "messages": [{"role": "user", "content": "forever"}]}
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: {")  # the first event
    conn.sock.close()  # type: ignore[union-attr]
    conn.close()
    assert recorder.disconnected.wait(30)


def test_an_upstream_that_answers_whole_despite_stream_still_serves_every_protocol(
    local: LiveServer, recorder: Recorder
) -> None:
    """llmd asks the upstream to stream; one that answers a whole JSON completion anyway
    (the recorder does) is read as one chunk."""
    hello = [{"role": "user", "content": "hi"}]
    status, msg, _ = call(
        local, "POST", "/v1/messages", {"model": "rec", "max_tokens": 4, "messages": hello}
    )
    assert status == 200 and msg["content"] == [{"type": "text", "text": "recorded"}]
    assert msg["usage"]["output_tokens"] == 1 and msg["model"] == "rec"
    status, chat, _ = call(
        local, "POST", "/api/chat", {"model": "rec", "messages": hello, "stream": False}
    )
    assert status == 200 and chat["message"]["content"] == "recorded"
    assert recorder.requests[-1]["body"]["stream"] is True


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"max_tokens": 4000}),
        ("/api/chat", {}),
        ("/v1/responses", {"input": "forever"}),
    ],
)
def test_a_client_leaving_any_protocols_stream_cancels_the_upstream_request(
    local: LiveServer, recorder: Recorder, path: str, body: dict[str, Any]
) -> None:
    recorder.disconnected.clear()
    conn = http.client.HTTPConnection("127.0.0.1", local.port, timeout=60)
    sent = {"model": "rec", "stream": True, "messages": [{"role": "user", "content": "forever"}]}
    if "input" in body:
        del sent["messages"]
    conn.request("POST", path, json.dumps({**sent, **body}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline()  # the stream started
    conn.sock.close()  # type: ignore[union-attr]
    conn.close()
    assert recorder.disconnected.wait(30)


def test_a_dead_upstream_is_a_502_in_the_envelope(local: LiveServer, model_path: Path) -> None:
    home = short_home()
    doomed = start_server(home)
    try:
        done = run_llmd(local.env, "remote", "add", "doomed", "--url", doomed.base_url)
        assert done.returncode == 0, done.stderr
    finally:
        stop_server(doomed)
        shutil.rmtree(home, ignore_errors=True)
    status, err, _ = call(
        local,
        "POST",
        "/v1/chat/completions",
        {"model": "doomed", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 502 and err["error"]["code"] == "upstream_unreachable"
    assert "doomed" in err["error"]["message"]
    health = _remote_status(local, "doomed")
    assert health["healthy"] is False and "doomed" in health["last_error"]
    run_llmd(local.env, "remote", "rm", "doomed")


def test_an_upstream_that_breaks_off_mid_stream_ends_it_with_an_error(local: LiveServer) -> None:
    stream = openai(local).chat.completions.create(
        model="rec", messages=[{"role": "user", "content": "break"}], stream=True
    )
    got = []
    with pytest.raises(APIError, match="remote 'rec'"):
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got and set(got) == {"x"}  # what arrived before the break, then the error


def test_stopping_the_daemon_lets_a_running_remote_request_finish(recorder: Recorder) -> None:
    home = short_home()
    daemon = start_server(home)
    try:
        done = run_llmd(
            daemon.env, "remote", "add", "held", "--url", recorder.url, "--model", "rec"
        )
        assert done.returncode == 0, done.stderr
        statuses: list[int] = []
        before = recorder.in_flight
        thread = _post_in_thread(daemon, "held", "hold", statuses)
        _wait_for(lambda: recorder.in_flight == before + 1, "the request upstream")
        daemon.proc.terminate()  # `llmd stop` sends SIGTERM: running requests may finish
        _wait_for(lambda: b"shutting down" in daemon.log.read_bytes(), "the drain")
        recorder.release()
        thread.join(60)
        assert statuses == [200]
    finally:
        stop_server(daemon)
        shutil.rmtree(home, ignore_errors=True)
