"""Hostile input never reaches a 500 or a hang (issue 30): deep nesting, lone surrogates,
over-long model names, a body that lies about its encoding, over-size bodies, keep_alive of
the wrong type, and pulls of things that are not model files. Each answer is checked for its
status and its protocol's error shape (OpenAI's envelope on /v1, Anthropic's on /v1/messages,
Ollama's on /api)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from llmd.api.http_common import check_json_value
from llmd.errors import ApiError
from llmd.paths import get_paths
from llmd.runtime.keep_alive import parse_keep_alive
from llmd.store.gguf_layout import GGUFFormatError, parse_layout
from llmd.store.gguf_metadata import GGUFMetadataError, read_gguf_metadata
from llmd.store.manifests import InsufficientStorage, StoreError
from llmd.store.model_store import ModelStore
from llmd.text.structured import _closed, json_schema_grammar
from tests.unit.fake_api import MODEL, api

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 4},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 4},
    "/v1/messages": {**CHAT, "max_tokens": 4},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": CHAT["messages"]},
    "/api/chat": {"model": MODEL, "messages": CHAT["messages"], "stream": False},
    "/api/generate": {"model": MODEL, "prompt": "hi", "stream": False},
    "/api/show": {"model": MODEL},
    "/infill": {"model": MODEL, "input_prefix": "a", "input_suffix": "b", "n_predict": 4},
}


def assert_error_shape(path: str, body: Any, status: int) -> str:
    """The message of an error `body`, after checking it has the shape `path`'s protocol
    uses."""
    if path.startswith("/v1/messages"):
        assert body["type"] == "error", body
        assert isinstance(body["error"]["type"], str) and body["error"]["message"], body
        return str(body["error"]["message"])
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str), body
        return str(body["error"])
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, body
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error") or (
        status == 404
    ), body
    return str(err["message"])


async def post_raw(client: Any, path: str, data: bytes | str, **headers: str) -> tuple[int, Any]:
    resp = await client.post(
        path, data=data, headers={"Content-Type": "application/json", **headers}
    )
    assert resp.content_type == "application/json", (resp.status, await resp.text())
    return resp.status, await resp.json()


async def test_deep_nesting_is_a_400_on_every_json_route(llmd_home: Path) -> None:
    deep = "[" * 1000 + "]" * 1000
    moderately = "[" * 200 + "]" * 200  # parses, but deeper than the body limit
    async with api(llmd_home) as client:
        for path in [*BODIES, "/v1/models/pull", "/api/pull", "/api/copy", "/api/delete"]:
            for nested in (deep, moderately):
                body = '{"model": "m", "messages": ' + nested + "}"
                if path == "/api/delete":
                    resp = await client.delete(path, data=body)
                    status, payload = resp.status, await resp.json()
                else:
                    status, payload = await post_raw(client, path, body)
                assert status == 400, (path, payload)
                assert "nests" in assert_error_shape(path, payload, status)
        # A normal request still works afterwards.
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 200


def test_depth_and_unicode_checks_do_not_recurse() -> None:
    value: Any = "x"
    for _ in range(100_000):  # built iteratively; json.loads could never produce it
        value = [value]
    with pytest.raises(ApiError) as err:
        check_json_value(value)
    assert err.value.status == 400 and err.value.code == "too_deeply_nested"
    check_json_value({"a": [{"b": ["é", "😀", 1, None, 2.5]}]})
    with pytest.raises(ApiError) as err:
        check_json_value({"a": [{"\ud800": 1}]})  # keys too
    assert "valid Unicode" in err.value.message


async def test_lone_surrogates_are_a_400_not_a_tokenizer_crash(llmd_home: Path) -> None:
    cases = [
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a\ud800"}]}),
        ("/v1/completions", {**BODIES["/v1/completions"], "prompt": "\udfff"}),
        ("/v1/completions", {**BODIES["/v1/completions"], "stop": ["\ud800"]}),
        ("/v1/responses", {**BODIES["/v1/responses"], "input": "\ud800"}),
        ("/v1/messages", {**CHAT, "system": "\ud800"}),
        ("/api/chat", {**BODIES["/api/chat"], "messages": [{"role": "user", "content": "\ud800"}]}),
        ("/api/generate", {**BODIES["/api/generate"], "prompt": "\ud800"}),
        ("/api/generate", {**BODIES["/api/generate"], "keep_alive": "5\ud800m"}),
        ("/v1/chat/completions", {**CHAT, "keep_alive": "\ud800"}),
    ]
    async with api(llmd_home) as client:
        for path, body in cases:
            # json.dumps escapes the lone surrogate as \ud800, which is what a client sends.
            status, payload = await post_raw(client, path, json.dumps(body))
            assert status == 400, (path, payload)
            assert "valid Unicode" in assert_error_shape(path, payload, status)
        # A surrogate encoded as UTF-8 bytes (json.loads lets them through), and invalid
        # UTF-8, are 400s too.
        status, payload = await post_raw(
            client, "/api/generate", b'{"model": "m", "prompt": "\xed\xa0\x80"}'
        )
        assert status == 400, payload
        assert "valid Unicode" in assert_error_shape("/api/generate", payload, status)
        status, payload = await post_raw(client, "/api/chat", b'{"model": "\xff\xfe"}')
        assert status == 400 and assert_error_shape("/api/chat", payload, status)
        resp = await client.post("/api/generate", json=BODIES["/api/generate"])
        assert resp.status == 200


async def test_over_long_model_names_are_not_found_without_touching_the_disk(
    llmd_home: Path,
) -> None:
    long = "a" * 5000
    async with api(llmd_home) as client:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/api/show"):
            body = {**BODIES[path], "model": long}
            status, payload = await post_raw(client, path, json.dumps(body))
            assert status == 404, (path, payload)
            message = assert_error_shape(path, payload, status)
            assert len(message) < 600 and "5000 characters" in message or "not" in message
        resp = await client.get("/v1/models/" + long)
        assert resp.status == 404
        assert_error_shape("/v1/models", await resp.json(), 404)
        resp = await client.delete("/api/delete", json={"model": long})
        assert resp.status in (400, 404)
        assert_error_shape("/api/delete", await resp.json(), resp.status)
        resp = await client.post("/api/copy", json={"source": MODEL, "destination": long})
        assert resp.status == 400
        assert "128" in assert_error_shape("/api/copy", await resp.json(), 400)
    store = ModelStore(get_paths())
    assert store.get("x" * 300) is None and store.get("a\x00b") is None


async def test_a_body_that_is_not_what_content_encoding_says_is_a_400(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat"):
            status, payload = await post_raw(
                client, path, json.dumps(CHAT).encode(), **{"Content-Encoding": "gzip"}
            )
            assert status == 400, (path, payload)
            assert "Content-Encoding" in assert_error_shape(path, payload, status)
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 200


async def test_an_over_size_body_is_a_413_in_the_protocols_shape(llmd_home: Path) -> None:
    async with api(llmd_home, max_body=64 * 1024) as client:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/models/pull"):
            status, payload = await post_raw(client, path, b"x" * (100 * 1024))
            assert status == 413, (path, payload)
            assert_error_shape(path, payload, status)


def test_keep_alive_takes_exactly_ollamas_types() -> None:
    assert parse_keep_alive("5m") == 300
    assert parse_keep_alive(30) == 30 and parse_keep_alive(1.5) == 1.5
    assert parse_keep_alive(-1) == float("inf") and parse_keep_alive("-1m") == float("inf")
    assert parse_keep_alive(10**400) == float("inf")
    for bad in (True, False, None, [1], {"s": 1}, "five minutes", "nan"):
        with pytest.raises(ValueError):
            parse_keep_alive(bad)  # type: ignore[arg-type]


async def test_keep_alive_true_is_a_400_not_one_second(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/api/generate"):
            for bad in (True, False, [5], {"m": 5}):
                body = {**BODIES[path], "keep_alive": bad}
                status, payload = await post_raw(client, path, json.dumps(body))
                assert status == 400, (path, bad, payload)
                assert "keep_alive" in assert_error_shape(path, payload, status)
        for good in ("5m", 30, -1, "0"):
            resp = await client.post(
                "/api/generate", json={**BODIES["/api/generate"], "keep_alive": good}
            )
            assert resp.status == 200, good


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    node = schema
    for _ in range(depth):
        child: dict[str, Any] = {"type": "object", "properties": {}}
        node["properties"]["a"] = child
        node = child
    return schema


def test_a_deep_strict_schema_is_a_400_naming_the_parameter() -> None:
    with pytest.raises(ApiError) as err:
        json_schema_grammar(nested_schema(450), strict=True, param="response_format.x")
    assert err.value.status == 400 and err.value.param == "response_format.x"


def test_closing_a_schema_is_unchanged_for_real_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"type": "string"}}},
            "list": {
                "type": "array",
                "items": [{"type": "object"}, {"anyOf": [{"properties": {}}]}],
            },
            "open": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"d": {"type": "object"}},
    }
    closed = _closed(schema)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert "additionalProperties" not in props  # a name -> schema map, not a schema
    assert props["properties"]["additionalProperties"] is False
    assert props["properties"]["properties"]["x"] == {"type": "string"}
    assert props["list"]["items"][0]["additionalProperties"] is False
    assert props["list"]["items"][1]["anyOf"][0]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True
    assert closed["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is left alone


# ---------------------------------------------------------------------- pulls


async def pull(client: Any, path: str, source: str) -> tuple[int, Any]:
    resp = await asyncio.wait_for(
        client.post(path, json={"model": source, "stream": False}), timeout=10
    )
    return resp.status, await resp.json()


async def test_pulls_of_things_that_are_not_model_files_are_refused_up_front(
    llmd_home: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)  # opening it would block until a writer comes: it must never be opened
    plain_dir = tmp_path / "notes"
    plain_dir.mkdir()
    (plain_dir / "readme.txt").write_text("hello")
    sources = {str(fifo): "FIFO", str(plain_dir): "not a Hugging Face model directory"}
    for special in ("/dev/null", "/dev/zero", "/proc/self/mem"):
        if os.path.exists(special):
            sources[special] = ""
    async with api(llmd_home) as client:
        for source, why in sources.items():
            for path in ("/v1/models/pull", "/api/pull"):
                status, payload = await pull(client, path, source)
                assert status == 400, (source, path, payload)
                message = assert_error_shape(path, payload, status)
                assert source in message and why in message, message
    with pytest.raises(StoreError, match="FIFO"):
        ModelStore(get_paths()).pull(str(fifo), "x")


def gguf_head(kv: bytes, n_kv: int, n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv


def gguf_string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def test_a_gguf_with_thousands_of_nested_arrays_is_a_clean_error(tmp_path: Path) -> None:
    depth = 5000
    value = struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)  # array of array ...
    kv = gguf_string("x.nested") + struct.pack("<I", 9) + value
    path = tmp_path / "nested.gguf"
    path.write_bytes(gguf_head(kv, 1))
    with pytest.raises(GGUFFormatError, match="nest"):
        parse_layout(path.read_bytes())
    with pytest.raises(GGUFMetadataError, match="nest"):
        read_gguf_metadata(path)
    with pytest.raises(StoreError, match="nest"):
        ModelStore(get_paths()).pull(str(path), "nested")


def test_a_gguf_without_tensors_or_tokenizer_is_refused_at_import(
    llmd_home: Path, tmp_path: Path
) -> None:
    kv = gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(gguf_head(kv, 1))
    with pytest.raises(StoreError, match="no tensors"):
        ModelStore(get_paths()).pull(str(empty), "empty")
    tensor = gguf_string("w") + struct.pack("<IQIQ", 1, 4, 0, 0)
    head = gguf_head(kv + tensor, 1, n_tensors=1)
    no_vocab = tmp_path / "novocab.gguf"
    no_vocab.write_bytes(head + b"\0" * (-len(head) % 32) + b"\0" * 16)
    with pytest.raises(StoreError, match="no tokenizer"):
        ModelStore(get_paths()).pull(str(no_vocab), "novocab")
    assert ModelStore(get_paths()).list() == []


def test_a_full_disk_during_an_import_names_the_space_needed(
    llmd_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_store_catalog_paths import fake_gguf

    src = fake_gguf(tmp_path / "m.gguf", b"x" * 1000)

    def full(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ModelStore, "add_file", full)
    with pytest.raises(InsufficientStorage) as err:
        ModelStore(get_paths()).pull(str(src), "m")
    assert err.value.status == 507 and err.value.code == "insufficient_storage"
    assert "GB free" in str(err.value)


async def test_requests_the_http_parser_refuses_are_answered_in_json() -> None:
    from aiohttp import web

    from llmd.api.security import SecurityConfig, make_runner

    app = web.Application()
    runner = make_runner(app, SecurityConfig())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        for raw in (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n",
            b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"zz\r\n",
            b"\x16\x03\x01 not http at all\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), timeout=10)
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"400", answer
            assert b"application/json" in head, answer
            err = json.loads(body)["error"]
            assert err["type"] == "invalid_request_error" and err["message"], err
    finally:
        await runner.cleanup()


async def test_a_disk_that_fills_up_mid_pull_is_a_507_naming_the_space(
    llmd_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmd.store.pulls import PullManager
    from tests.unit.test_store_catalog_paths import fake_gguf

    src = fake_gguf(tmp_path / "m.gguf")

    async def full(self: Any, job: Any, path: Path) -> Any:
        job.emit({"status": "copying", "total": 5_000_000_000, "completed": 10}, progress=True)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PullManager, "_import", full)
    async with api(llmd_home) as client:
        for path in ("/v1/models/pull", "/api/pull"):
            status, payload = await pull(client, path, str(src))
            assert status == 507, payload
            message = assert_error_shape(path, payload, status)
            assert "5.00 GB free" in message, message
            if path.startswith("/v1"):
                assert payload["error"]["code"] == "insufficient_storage"


async def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(llmd_home: Path) -> None:
    # 1 MB of text: even at 4x the vocabulary's longest token (81 characters) it exceeds the
    # served context (this app's: 256 tokens), so it is refused from its length alone ("at
    # least"), on every protocol, instead of holding the tokenizer (and the GIL) for seconds.
    big = "x" * 1_000_000
    cases = [
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": big}]}),
        ("/v1/completions", {**BODIES["/v1/completions"], "prompt": big}),
        ("/v1/messages", {**CHAT, "messages": [{"role": "user", "content": big}]}),
        ("/api/generate", {**BODIES["/api/generate"], "prompt": big, "raw": True}),
    ]
    async with api(llmd_home, max_body=8 << 20) as client:
        for path, body in cases:
            status, payload = await post_raw(client, path, json.dumps(body))
            assert status == 400, (path, payload)
            message = assert_error_shape(path, payload, status)
            # (Anthropic keeps the wording Claude Code parses: "prompt is too long: N tokens")
            assert "3086 tokens" in message, message
        resp = await client.post("/api/generate", json=BODIES["/api/generate"])
        assert resp.status == 200
