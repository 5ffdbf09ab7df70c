"""The HTTP API end to end - routes, streaming, stop strings, errors, cancellation - with the
real tokenizer and chat template of the default model but the FAKE worker
(tests/fakes/fake_worker.py), which echoes the prompt's tokens back. Model behaviour is the
integration tests' business; these pin down what the daemon itself does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from llmd.api.server import REGISTRY
from llmd.paths import get_paths
from tests.unit.fake_api import MODEL, api, complete, sent_to_worker, sse_events


async def test_completion_echo_reports_text_usage_and_stop(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        status, body = await complete(client, prompt="Hello world, again.")
    assert status == 200
    choice = body["choices"][0]
    assert choice["text"] == "Hello world, again."
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    # The fake counts its invisible EOS as a generated token, like the real engine.
    assert usage["completion_tokens"] == usage["prompt_tokens"] + 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["object"] == "text_completion" and body["model"] == MODEL


async def test_max_tokens_cuts_with_length(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        status, body = await complete(client, prompt="one two three four five six", max_tokens=3)
    assert status == 200
    assert body["choices"][0] == {
        "index": 0,
        "text": "one two three",
        "logprobs": None,
        "finish_reason": "length",
    }
    assert body["usage"]["completion_tokens"] == 3


async def test_absent_max_tokens_means_the_rest_of_the_context(llmd_home: Path) -> None:
    async with api(llmd_home, context=200) as client:
        status, body = await complete(client, prompt="a b c")
        assert status == 200
        [gen] = sent_to_worker(client, "generate")
    assert gen["max_tokens"] == 200 - body["usage"]["prompt_tokens"]


async def test_sampling_parameters_and_stop_tokens_reach_the_worker(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        status, _ = await complete(
            client,
            prompt="x",
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=1234,
            frequency_penalty=0.5,
            presence_penalty=-0.25,
            repetition_penalty=1.1,
            logit_bias={"42": -100},
            logprobs=3,
        )
        assert status == 200
        [gen] = sent_to_worker(client, "generate")
    assert gen["sampling"] == {
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "seed": 1234,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.25,
        "repetition_penalty": 1.1,
        "repetition_window": 0,  # repeat_last_n -1 (default): the whole context
        "logit_bias": {"42": -100.0},
        "top_logprobs": 3,
    }
    # SmolLM2: eos <|im_end|> (2) plus <|endoftext|> (0), as llama.cpp's end-of-generation set.
    assert gen["stop_tokens"] == [2, 0]


async def test_stop_string_across_tokens_is_cut_and_removed(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        status, body = await complete(client, prompt="one two three four", stop=["o th"])
        assert status == 200
        # Streaming: no delta ever shows the part of the stop string that came before it.
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "one two three four", "stop": "o th", "stream": True},
        )
        events = await sse_events(resp)
    assert body["choices"][0]["text"] == "one tw"
    assert body["choices"][0]["finish_reason"] == "stop"
    chunks = [e for e in events if isinstance(e, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "one tw"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == "[DONE]"


async def test_chat_uses_the_models_template_and_hides_end_of_turn(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [
                    {
                        "role": "system",
                        "content": [
                            {"type": "text", "text": "Be "},
                            {"type": "text", "text": "brief."},
                        ],
                    },
                    {"role": "user", "content": "Hi"},
                ],
            },
        )
        body = await resp.json()
        [gen] = sent_to_worker(client, "generate")
    assert resp.status == 200
    # The echo runs up to the first <|im_end|>: the template's system turn, parts joined.
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "system\nBe brief.",
        "refusal": None,
    }
    assert body["choices"][0]["finish_reason"] == "stop"
    assert gen["prompt"][0] == 1  # <|im_start|>, no BOS added on top (add_bos_token false)
    assert body["object"] == "chat.completion"


async def test_chat_stream_matches_non_stream_and_reports_usage_last(llmd_home: Path) -> None:
    msgs = [{"role": "system", "content": "Streams are fun"}, {"role": "user", "content": "x"}]
    async with api(llmd_home, batch=2) as client:
        full = await (
            await client.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs})
        ).json()
        resp = await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": msgs,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["stop"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]


async def test_streaming_never_splits_a_utf8_character(llmd_home: Path) -> None:
    prompt = "长城🙂 naïve café ☕ 𝄞"
    async with api(llmd_home) as client:
        resp = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "stream": True}
        )
        events = await sse_events(resp)
    deltas = [e["choices"][0]["text"] for e in events if isinstance(e, dict)]
    assert "".join(deltas) == prompt
    assert all("\ufffd" not in d for d in deltas)
    # Byte-level tokens split these characters: some tokens produced no text of their own.
    assert len([d for d in deltas if d]) < len(deltas)


async def test_concurrent_requests_are_multiplexed_by_id(llmd_home: Path) -> None:
    prompts = [f"request number {i} says {'hello ' * (i + 2)}" for i in range(4)]
    async with api(llmd_home, token_delay=0.01) as client:
        results = await asyncio.gather(*(complete(client, prompt=pr) for pr in prompts))
        ids = {g["id"] for g in sent_to_worker(client, "generate")}
    assert [body["choices"][0]["text"] for _, body in results] == prompts
    assert len(ids) == 4


async def test_client_disconnect_mid_stream_cancels_in_the_worker(llmd_home: Path) -> None:
    async with api(llmd_home, token_delay=0.05) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "word " * 100, "stream": True},
        )
        await resp.content.readline()  # the stream is running
        resp.close()  # the client goes away
        deadline = time.monotonic() + 5
        while not sent_to_worker(client, "cancel") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        [gen] = sent_to_worker(client, "generate")
        assert [c["id"] for c in sent_to_worker(client, "cancel")] == [gen["id"]]
        # ...and the daemon keeps serving.
        status, body = await complete(client, prompt="still here")
    assert status == 200 and body["choices"][0]["text"] == "still here"


async def test_error_after_stream_start_is_one_sse_error_event(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "a b c d e f", "stream": True, "seed": 667},
        )
        events = await sse_events(resp)
        status, body = await complete(client, prompt="a b c d", seed=667)
    assert resp.status == 200
    assert "[DONE]" not in events
    assert set(events[-1]) == {"error"}
    assert set(events[-1]["error"]) == {"message", "type", "param", "code"}
    assert status == 500 and body["error"]["code"] == "internal"


async def test_worker_crash_is_503_and_the_next_request_gets_a_new_worker(
    llmd_home: Path,
) -> None:
    async with api(llmd_home) as client:
        status, body = await complete(client, prompt="a b c d", seed=666)
        assert status == 503 and body["error"]["code"] == "worker_died"
        status, body = await complete(client, prompt="back again")
    assert status == 200 and body["choices"][0]["text"] == "back again"


async def test_worker_that_cannot_load_is_503_with_its_reason(llmd_home: Path) -> None:
    async with api(llmd_home, fatal="unsupported architecture 'mamba'") as client:
        status, body = await complete(client, prompt="x")
    assert status == 503
    assert "unsupported architecture 'mamba'" in body["error"]["message"]
    assert body["error"]["type"] == "server_error"


async def test_max_tokens_beyond_the_context_is_clamped_to_the_room_left(llmd_home: Path) -> None:
    """Agents ask for 32k tokens whatever the model: the request runs with what fits (as
    llama-server and Ollama do) instead of a 400."""
    async with api(llmd_home, context=256) as client:
        status, _ = await complete(client, prompt="x", max_tokens=500)
        [sent] = sent_to_worker(client, "generate")
    assert status == 200
    assert sent["max_tokens"] == 256 - len(sent["prompt"])


@pytest.mark.parametrize(
    "body,param,code",
    [
        ({"prompt": "word " * 300}, "prompt", "context_length_exceeded"),
        ({"prompt": "x", "temperature": 3}, "temperature", None),
        ({"prompt": "x", "top_k": 2**31}, "top_k", None),  # past the engine's int32
        ({"prompt": "x", "repeat_last_n": 2**31}, "repeat_last_n", None),
        ({"prompt": "x", "top_p": 0}, "top_p", None),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", None),
        ({"prompt": "x", "logprobs": 21}, "logprobs", None),
        ({"prompt": "x", "max_tokens": 0, "echo": False}, "max_tokens", None),
        ({"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty", None),
        ({"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias", None),
        ({"prompt": "x", "wat": 1}, "wat", "unknown_parameter"),
        ({"prompt": ["a", "b"]}, "prompt", None),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", None),
    ],
)
async def test_bad_completion_requests_are_400_naming_the_parameter(
    llmd_home: Path, body: dict[str, Any], param: str, code: str | None
) -> None:
    async with api(llmd_home, context=256) as client:
        status, payload = await complete(client, **body)
    assert status == 400
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["code"] == code


async def test_unknown_and_not_installed_models_are_404_saying_how_to_get_them(
    llmd_home: Path,
) -> None:
    async with api(llmd_home) as client:
        status, unknown = await complete(client, model="nope-7b", prompt="x")
        hub_status, hub = await complete(client, model="smollm2-360m", prompt="x")
    assert status == hub_status == 404
    assert unknown["error"]["code"] == "model_not_found" and unknown["error"]["param"] == "model"
    assert "llmd pull ./model.gguf --name nope-7b" in unknown["error"]["message"]
    assert "Download it with `llmd pull smollm2-360m`" in hub["error"]["message"]


async def test_malformed_json_and_non_object_bodies_are_400(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        bad = await client.post(
            "/v1/chat/completions", data=b'{"model": ', headers={"Content-Type": "application/json"}
        )
        arr = await client.post("/v1/chat/completions", json=[1, 2])
        bad_body, arr_body = await bad.json(), await arr.json()
    assert bad.status == 400 and "not valid JSON" in bad_body["error"]["message"]
    assert arr.status == 400 and "JSON object" in arr_body["error"]["message"]


async def test_oversized_body_is_413_in_the_openai_envelope(llmd_home: Path) -> None:
    async with api(llmd_home, max_body=4096) as client:
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "a" * 10_000})
        body = await resp.json()
    assert resp.status == 413
    assert body["error"]["code"] == "request_too_large"


async def test_unknown_route_is_404_in_the_openai_envelope(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        resp = await client.get("/v1/nothing-here")
        body = await resp.json()
    assert resp.status == 404 and set(body["error"]) == {"message", "type", "param", "code"}


async def test_models_and_health(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        models = await (await client.get("/v1/models")).json()
        health = await (await client.get("/health")).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]  # served from the package, no pull
    assert health["status"] == "ok"


async def test_removed_model_stops_being_served(llmd_home: Path, model_path: Path) -> None:
    from llmd.store.model_store import ModelStore

    store = ModelStore(get_paths())
    store.pull(str(model_path), "mine")
    async with api(llmd_home) as client:
        status, _ = await complete(client, model="mine", prompt="x")
        assert status == 200
        store.remove("mine")
        status, body = await complete(client, model="mine", prompt="x")
    assert status == 404 and body["error"]["code"] == "model_not_found"


async def test_requests_past_the_queue_limit_get_429_and_the_others_complete(
    llmd_home: Path,
) -> None:
    """The fake worker runs 8 sequences; with a queue limit of 2, 10 requests are in flight
    and more get 429 in the OpenAI envelope, streams too (before any byte of the stream)."""
    async with api(llmd_home, app_options={"queue_limit": 2}, token_delay=0.05) as client:
        busy = [
            asyncio.create_task(complete(client, prompt="word " * 40, max_tokens=30))
            for _ in range(10)
        ]
        deadline = time.monotonic() + 30
        while len(sent_to_worker(client, "generate")) < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        status, body = await complete(client, prompt="one more")
        assert status == 429
        assert body["error"]["code"] == "queue_full"
        assert "retry" in body["error"]["message"] and "queue limit 2" in body["error"]["message"]
        resp = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "streamed", "stream": True}
        )
        assert resp.status == 429 and (await resp.json())["error"]["code"] == "queue_full"
        results = await asyncio.gather(*busy)
        assert [s for s, _ in results] == [200] * 10
        assert len(sent_to_worker(client, "generate")) == 10  # refused ones never reached it
        status, body = await complete(client, prompt="room again")
    assert status == 200 and body["choices"][0]["text"] == "room again"


async def test_kv_budget_and_batch_size_reach_the_worker(llmd_home: Path) -> None:
    opts = {"kv_budget_bytes": 3 << 30, "max_sequences": 12}
    async with api(llmd_home, app_options=opts) as client:
        status, _ = await complete(client, prompt="hello")
        [loaded] = client.server.app[REGISTRY].loaded()
    assert status == 200
    assert loaded.worker.ready.kv_budget_bytes == 3 << 30
    assert loaded.worker.ready.max_sequences == 12


async def test_named_sessions_are_listed_and_deleted_and_unpinned_in_the_worker(
    llmd_home: Path,
) -> None:
    async with api(llmd_home) as client:
        status, _ = await complete(client, prompt="turn one", session_id="chat-7")
        assert status == 200
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "turn two"},
            headers={"X-Llmd-Session-Id": "chat-7"},
        )
        assert resp.status == 200
        listed = await (await client.get("/v1/sessions")).json()
        [s] = listed["data"]
        assert (s["id"], s["model"], s["requests"], s["active_requests"]) == ("chat-7", MODEL, 2, 0)
        assert [g["session"] for g in sent_to_worker(client, "generate")] == ["chat-7", "chat-7"]
        resp = await client.delete("/v1/sessions/chat-7")
        assert resp.status == 200 and (await resp.json())["deleted"] is True
        deadline = time.monotonic() + 5
        while not sent_to_worker(client, "unpin") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert [u["session"] for u in sent_to_worker(client, "unpin")] == ["chat-7"]
        assert (await (await client.get("/v1/sessions")).json())["data"] == []
        resp = await client.delete("/v1/sessions/chat-7")
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "session_not_found"
        # Plain requests name no session.
        status, _ = await complete(client, prompt="no session")
        assert sent_to_worker(client, "generate")[-1]["session"] == ""


async def test_session_limit_unpins_the_least_recently_used_and_bad_ids_are_400(
    llmd_home: Path,
) -> None:
    async with api(llmd_home, app_options={"max_sessions": 2}) as client:
        assert (await complete(client, prompt="a", session_id="one"))[0] == 200
        assert (await complete(client, prompt="b", session_id="two"))[0] == 200
        assert (await complete(client, prompt="c", session_id="one"))[0] == 200  # two is older
        # A third session makes room: "two" (least recently used) is unpinned, not refused.
        assert (await complete(client, prompt="d", session_id="three"))[0] == 200
        ids = sorted(s["id"] for s in (await (await client.get("/v1/sessions")).json())["data"])
        assert ids == ["one", "three"]
        deadline = time.monotonic() + 5
        while not sent_to_worker(client, "unpin") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert [u["session"] for u in sent_to_worker(client, "unpin")] == ["two"]
        status, body = await complete(client, prompt="d", session_id="no spaces please")
        assert status == 400 and body["error"]["param"] == "session_id"


async def test_other_tools_session_headers_do_not_pin(llmd_home: Path) -> None:
    """opencode sends `x-session-id: ses_...` on every request: that is not llmd's header."""
    async with api(llmd_home, app_options={"max_sessions": 1}) as client:
        for i in range(3):
            resp = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": f"turn {i}"},
                headers={"x-session-id": f"ses_{i}"},
            )
            assert resp.status == 200
        assert (await (await client.get("/v1/sessions")).json())["data"] == []
        assert {g["session"] for g in sent_to_worker(client, "generate")} == {""}


async def test_when_every_session_is_running_a_new_one_runs_unpinned(llmd_home: Path) -> None:
    async with api(llmd_home, app_options={"max_sessions": 1}, token_delay=0.05) as client:
        slow = asyncio.create_task(complete(client, prompt="word " * 30, session_id="busy"))
        while not sent_to_worker(client, "generate"):
            await asyncio.sleep(0.01)
        status, _ = await complete(client, prompt="quick", session_id="newcomer")
        assert status == 200 and (await slow)[0] == 200
        sessions = {g["prompt"][0]: g["session"] for g in sent_to_worker(client, "generate")}
        assert sorted(sessions.values()) == ["", "busy"]


async def test_idle_sessions_expire_after_their_ttl_unless_overridden(llmd_home: Path) -> None:
    opts = {"session_ttl": 0.3, "session_sweep_interval": 0.05}
    async with api(llmd_home, app_options=opts) as client:
        await complete(client, prompt="short", session_id="brief")
        await complete(client, prompt="long", session_id="kept", session_ttl=60)
        await asyncio.sleep(1.0)
        ids = [s["id"] for s in (await (await client.get("/v1/sessions")).json())["data"]]
        assert ids == ["kept"]
        assert [u["session"] for u in sent_to_worker(client, "unpin")] == ["brief"]


async def test_a_slow_openai_stream_sends_keepalive_comments(llmd_home: Path) -> None:
    options = {"stream_keepalive": 0.05}
    async with api(llmd_home, app_options=options, token_delay=0.3) as client:
        resp = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "a b", "stream": True}
        )
        text = await resp.text()
    frames = [f for f in text.split("\n\n") if f.strip()]
    assert frames.index(": keep-alive") < 2  # before the first token, while it "prefills"
    assert frames[-1] == "data: [DONE]"
    assert all(f == ": keep-alive" or f.startswith("data: ") for f in frames)


async def test_models_report_the_served_context_and_capabilities(llmd_home: Path) -> None:
    """Agents size their compaction from this: the context the engine serves (the worker's
    once loaded), as context_length and max_model_len, and what the model can do."""
    async with api(llmd_home, context=512) as client:
        listed = await (await client.get("/v1/models")).json()
        entry = next(m for m in listed["data"] if m["id"] == MODEL)
        assert entry["context_length"] == entry["max_model_len"] == 8192  # trained, not loaded
        assert entry["capabilities"]["tools"] and not entry["capabilities"]["vision"]
        await complete(client, prompt="load it")
        one = await (await client.get(f"/v1/models/{MODEL}")).json()
        assert one["id"] == MODEL and one["context_length"] == one["max_model_len"] == 512
        assert one["trained_context_length"] == 8192
        show = await (await client.post("/api/show", json={"model": MODEL})).json()
        assert show["model_info"]["llama.context_length"] == 512
        assert "num_ctx" in show["parameters"] and "512" in show["parameters"]
        missing = await client.get("/v1/models/no-such-model")
        assert missing.status == 404
        assert (await missing.json())["error"]["code"] == "model_not_found"
        pulls = await client.get("/v1/models/pulls")  # not shadowed by /v1/models/{id}
        assert pulls.status == 200


async def test_default_max_tokens_limits_chat_requests_that_name_none(llmd_home: Path) -> None:
    async with api(llmd_home, app_options={"default_max_tokens": 7}) as client:
        hi = [{"role": "user", "content": "hi"}]
        await client.post("/v1/chat/completions", json={"model": MODEL, "messages": hi})
        body = {"model": MODEL, "messages": hi, "max_tokens": 9}
        await client.post("/v1/chat/completions", json=body)
        limits = [g["max_tokens"] for g in sent_to_worker(client, "generate")]
    assert limits == [7, 9]  # the server default, then what the client asked for
