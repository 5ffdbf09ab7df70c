"""n choices, logprobs, echo and response_format through the HTTP API with the FAKE worker
(tests/fakes/fake_worker.py: it echoes the prompt's tokens and reports fixed logprobs, -0.25
per generated token and -1.0 per scored prompt token). The real model's values are checked in
tests/integration/test_api_features.py; these pin down the shapes and the plumbing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.unit.fake_api import MODEL, api, complete, sent_to_worker, sse_events


async def test_n_choices_each_get_a_generation_and_usage_counts_the_prompt_once(
    llmd_home: Path,
) -> None:
    async with api(llmd_home) as client:
        status, one = await complete(client, prompt="a b c")
        status_n, many = await complete(client, prompt="a b c", n=3, seed=5)
        seeds = [g["sampling"]["seed"] for g in sent_to_worker(client, "generate")[1:]]
    assert status == status_n == 200
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert {c["text"] for c in many["choices"]} == {"a b c"}
    assert many["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert many["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    assert sorted(seeds) == [5, 6, 7]


async def test_a_client_gone_mid_stream_cancels_every_choice(llmd_home: Path) -> None:
    async with api(llmd_home, token_delay=0.05) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "word " * 50, "stream": True, "n": 3},
        )
        async for raw in resp.content:
            if raw.startswith(b"data: ") and b'"index": 2' in raw:
                break  # all three choices are running
        resp.close()
        deadline = time.monotonic() + 10
        while len(sent_to_worker(client, "cancel")) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cancels = {c["id"] for c in sent_to_worker(client, "cancel")}
        generates = {g["id"] for g in sent_to_worker(client, "generate")}
    assert cancels == generates and len(cancels) == 3


async def test_chat_logprobs_have_openai_shape_streamed_or_not(llmd_home: Path) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "top_logprobs": 2,
        "max_tokens": 4,
    }
    async with api(llmd_home) as client:
        whole = await (await client.post("/v1/chat/completions", json=body)).json()
        events = await sse_events(
            await client.post("/v1/chat/completions", json={**body, "stream": True})
        )
    entries = whole["choices"][0]["logprobs"]["content"]
    assert len(entries) == 4
    for e in entries:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert e["logprob"] == -0.25 and bytes(e["bytes"]).decode() == e["token"]
        assert [t["logprob"] for t in e["top_logprobs"]] == [-0.25, -2.0]
    streamed = [
        x
        for ev in events[:-1]
        for c in ev["choices"]
        for x in (c["logprobs"] or {}).get("content", [])
    ]
    assert streamed == entries


async def test_completion_echo_with_logprobs_scores_the_prompt_then_the_answer(
    llmd_home: Path,
) -> None:
    async with api(llmd_home) as client:
        status, body = await complete(client, prompt="one two", echo=True, logprobs=1, max_tokens=2)
        status0, scored = await complete(
            client, prompt="one two", echo=True, logprobs=1, max_tokens=0
        )
    assert status == status0 == 200
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "one two" + "one two"[: len(choice["text"]) - len("one two")]
    assert lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1] == -1.0 and lp["token_logprobs"][-1] == -0.25
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert scored["choices"][0]["text"] == "one two"
    assert scored["usage"]["completion_tokens"] == 0
    assert len(sent_to_worker(client, "score")) == 2


async def test_response_format_reaches_the_worker_as_a_grammar(llmd_home: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    async with api(llmd_home) as client:
        status, _ = await complete(client, prompt="x", response_format=fmt, max_tokens=2)
        plain, _ = await complete(client, prompt="x", max_tokens=2)
        bad, err = await complete(
            client,
            prompt="x",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "strict": True, "schema": {"type": "wat"}},
            },
        )
        grammars = [g["grammar"] for g in sent_to_worker(client, "generate")]
    assert status == plain == 200
    assert grammars[0] and '"additionalProperties": false' in grammars[0].replace(
        ":false", ": false"
    )
    assert grammars[1] is None
    assert bad == 400 and err["error"]["param"] == "response_format.json_schema.schema"
