"""Supervision and model lifetimes with the FAKE worker (tests/fakes/fake_worker.py), whose
magic seeds crash or hang it on demand: warmup before traffic, restarts with backoff, a
request that had not started yet going to the new worker, crash loops marked failed, hung
workers killed, keep-alive, LRU unloading by count and by memory, and draining on stop. The
real worker's crash handling is tested in tests/integration/test_lifecycle.py."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from llmd.api.server import drain
from llmd.cli.main import _pid_alive as alive  # a zombie, or one reaped mid-check, has exited
from llmd.paths import get_paths
from llmd.runtime.keep_alive import FOREVER, parse_keep_alive
from llmd.runtime.supervisor import RestartPolicy
from llmd.store.model_store import ModelStore
from tests.unit.fake_api import MODEL, api, complete, sent_to_worker, sse_events

FAST = RestartPolicy(first_backoff=0.01, max_backoff=0.05, max_failures=3, health_interval=0.2)


async def status_of(client: TestClient) -> dict[str, Any]:
    return await (await client.get("/status")).json()


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "text,seconds",
    [("5m", 300), ("1h30m", 5400), ("90s", 90), ("500ms", 0.5), ("0", 0), (0, 0), (12.5, 12.5)],
)
def test_keep_alive_durations_parse_as_ollama_does(text: Any, seconds: float) -> None:
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("text", [-1, "-1", "-5m"])
def test_negative_keep_alive_means_forever(text: Any) -> None:
    assert parse_keep_alive(text) == FOREVER


@pytest.mark.parametrize("text", ["soon", "5 minutes", "", "m5", True])
def test_malformed_keep_alive_is_refused(text: Any) -> None:
    with pytest.raises(ValueError):
        parse_keep_alive(text)


async def test_a_new_worker_is_warmed_up_before_it_takes_traffic(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        status, body = await complete(client, prompt="first request")
        info = await status_of(client)
        log = (llmd_home / "fake-worker.jsonl").read_text().splitlines()
    assert status == 200 and body["choices"][0]["text"] == "first request"
    [model] = info["models"]
    assert model["state"] == "ready"
    assert model["warmup"]["prompt_tokens"] > 0 and model["warmup"]["ms"] > 0
    assert '"id": "warmup' in log[0] or '"id":"warmup' in log[0]  # before the client's
    assert len(sent_to_worker(client, "generate")) == 1


async def test_a_request_whose_worker_dies_before_its_first_token_goes_to_the_new_worker(
    llmd_home: Path,
) -> None:
    marker = llmd_home / "crashed-once"
    opts = {"restart_policy": FAST}
    async with api(llmd_home, app_options=opts, crash_marker=marker) as client:
        status, body = await complete(client, prompt="survives a crash", seed=665)
        info = await status_of(client)
    assert marker.exists()  # the first worker did die on it
    assert status == 200 and body["choices"][0]["text"] == "survives a crash"
    assert info["models"][0]["restarts"] == 1
    assert "status 19" in info["models"][0]["last_error"]


async def test_a_crash_mid_stream_is_an_error_event_and_the_worker_restarts(
    llmd_home: Path,
) -> None:
    async with api(llmd_home, app_options={"restart_policy": FAST}, token_delay=0.01) as client:
        first = (await status_of(client))["models"]
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "a b c d e f", "stream": True, "seed": 666},
        )
        events = await sse_events(resp)

        async def restarted() -> bool:
            m = (await status_of(client))["models"][0]
            return m["state"] == "ready" and m["restarts"] == 1

        await wait_for(restarted)  # eagerly, before any new request
        crash = (await status_of(client))["models"][0]["last_error"]
        status, body = await complete(client, prompt="after the crash")
    assert first == []
    assert events[-1]["error"]["code"] == "worker_died" and "[DONE]" not in events
    assert "status 17" in crash
    assert status == 200 and body["choices"][0]["text"] == "after the crash"


async def test_a_crash_looping_model_is_marked_failed_with_its_last_error(
    llmd_home: Path,
) -> None:
    async with api(llmd_home, app_options={"restart_policy": FAST}) as client:
        for _ in range(3):  # each worker dies on its first request, none ever completes one
            status, body = await complete(client, prompt="a b c d", seed=666)
            assert status == 503

        async def failed() -> bool:
            return (await status_of(client))["models"][0]["state"] == "failed"

        await wait_for(failed)
        status, body = await complete(client, prompt="anyone home?")
        info = await status_of(client)
        health = await client.get("/health")
    assert status == 503 and body["error"]["code"] == "model_failed"
    assert "failed 3 times in a row" in body["error"]["message"]
    model = info["models"][0]
    assert model["consecutive_failures"] == 3 and model["pid"] is None
    assert "status 17" in model["last_error"] and "fake worker ready" in model["last_error"]
    assert model["retry_at"] > time.time()
    assert health.status == 200  # the daemon itself is fine


async def test_a_model_that_cannot_load_fails_after_repeated_tries(llmd_home: Path) -> None:
    opts = {"restart_policy": FAST}
    async with api(llmd_home, app_options=opts, fatal="unsupported architecture 'mamba'") as client:
        codes = [(await complete(client, prompt="x"))[1]["error"]["code"] for _ in range(4)]
        info = await status_of(client)
    assert codes == ["load_failed", "load_failed", "model_failed", "model_failed"]
    assert info["models"][0]["state"] == "failed"
    assert "unsupported architecture 'mamba'" in info["models"][0]["last_error"]


async def test_a_hung_worker_is_killed_its_requests_fail_and_a_new_one_serves(
    llmd_home: Path,
) -> None:
    policy = RestartPolicy(first_backoff=0.01, health_interval=0.2, hang_timeout=0.5)
    async with api(llmd_home, app_options={"restart_policy": policy}) as client:
        started = time.monotonic()
        status, body = await complete(client, prompt="hang", seed=668)
        took = time.monotonic() - started
        status2, body2 = await complete(client, prompt="unstuck")
        info = await status_of(client)
    assert status == 503 and body["error"]["code"] == "worker_died"
    assert "SIGKILL" in body["error"]["message"]
    assert took < 10  # bounded by the health check, not by the hang
    assert status2 == 200 and body2["choices"][0]["text"] == "unstuck"
    assert "health ping" in info["models"][0]["last_error"]


async def test_keep_alive_unloads_an_idle_model_and_stops_its_worker(llmd_home: Path) -> None:
    opts = {"keep_alive": 0.3, "session_sweep_interval": 0.05}
    async with api(llmd_home, app_options=opts) as client:
        await complete(client, prompt="hi")
        pid = (await status_of(client))["models"][0]["pid"]

        async def unloaded() -> bool:
            return (await status_of(client))["models"] == [] and not alive(pid)

        await wait_for(unloaded)
        status, _ = await complete(client, prompt="reloads on demand")
    assert status == 200


async def test_request_keep_alive_overrides_the_default(llmd_home: Path) -> None:
    opts = {"keep_alive": 300.0, "session_sweep_interval": 0.05}
    async with api(llmd_home, app_options=opts) as client:
        await complete(client, prompt="stay", keep_alive=-1)
        forever = (await status_of(client))["models"][0]
        await complete(client, prompt="until", keep_alive="2m")
        two_minutes = (await status_of(client))["models"][0]
        await complete(client, prompt="now", keep_alive=0)
        after_zero = (await status_of(client))["models"]
        bad, body = await complete(client, prompt="x", keep_alive="soon")
    assert forever["expires_at"] is None and forever["keep_alive_s"] is None
    assert two_minutes["keep_alive_s"] == 120
    assert math.isclose(two_minutes["expires_at"] - time.time(), 120, abs_tol=10)
    assert after_zero == []
    assert bad == 400 and body["error"]["param"] == "keep_alive"


async def test_a_named_session_keeps_its_model_loaded_past_the_keep_alive(
    llmd_home: Path,
) -> None:
    opts = {"keep_alive": 0.2, "session_sweep_interval": 0.05, "session_ttl": 1.0}
    async with api(llmd_home, app_options=opts) as client:
        await complete(client, prompt="turn one", session_id="s1")
        await asyncio.sleep(0.5)  # past the keep-alive, within the session's TTL
        held = (await status_of(client))["models"]

        async def unloaded() -> bool:
            return (await status_of(client))["models"] == []

        await wait_for(unloaded)
    assert len(held) == 1


def _second_model(model_path: Path) -> None:
    ModelStore(get_paths()).pull(str(model_path), "second")


async def test_loading_past_max_loaded_unloads_the_least_recently_used(
    llmd_home: Path, model_path: Path
) -> None:
    _second_model(model_path)
    async with api(llmd_home, app_options={"max_loaded": 1}) as client:
        await complete(client, prompt="one")
        first_pid = (await status_of(client))["models"][0]["pid"]
        status, _ = await complete(client, model="second", prompt="two")
        names = [m["name"] for m in (await status_of(client))["models"]]
    assert status == 200 and names == ["second"]
    assert not alive(first_pid)


async def test_loading_past_the_memory_budget_unloads_the_least_recently_used(
    llmd_home: Path, model_path: Path
) -> None:
    _second_model(model_path)
    size = model_path.stat().st_size
    opts = {"memory_budget": int(size * 1.5), "kv_budget_bytes": 1 << 20}
    async with api(llmd_home, app_options=opts) as client:
        await complete(client, prompt="one")
        await complete(client, model="second", prompt="two")
        names = [m["name"] for m in (await status_of(client))["models"]]
    assert names == ["second"]


async def test_a_busy_model_is_never_unloaded_to_make_room(
    llmd_home: Path, model_path: Path
) -> None:
    _second_model(model_path)
    async with api(llmd_home, app_options={"max_loaded": 1}, token_delay=0.05) as client:
        busy = asyncio.create_task(complete(client, prompt="word " * 30, max_tokens=30))
        await wait_for(lambda: _generating(client))
        status, body = await complete(client, model="second", prompt="two")
        done_status, done = await busy
    assert status == 503 and body["error"]["code"] == "insufficient_capacity"
    assert "--max-loaded 1" in body["error"]["message"]
    assert done_status == 200 and done["usage"]["completion_tokens"] == 30


async def _generating(client: TestClient) -> bool:
    return len(sent_to_worker(client, "generate")) > 0


async def test_preloaded_models_are_warm_before_any_request_and_stay(llmd_home: Path) -> None:
    async with api(llmd_home, app_options={"preload": (MODEL,), "keep_alive": 0.1}) as client:

        async def ready() -> bool:
            models = (await status_of(client))["models"]
            return bool(models) and models[0]["state"] == "ready"

        await wait_for(ready)
        await asyncio.sleep(0.3)
        model = (await status_of(client))["models"][0]
    assert model["expires_at"] is None and model["warmup"] is not None


async def test_drain_lets_running_streams_finish_and_refuses_new_requests(
    llmd_home: Path,
) -> None:
    async with api(llmd_home, token_delay=0.02) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "word " * 40, "stream": True, "max_tokens": 40},
        )
        draining = asyncio.create_task(drain(client.server.app, timeout=20))
        await asyncio.sleep(0.1)
        refused, body = await complete(client, prompt="too late")
        events = await sse_events(resp)
        await draining
    assert refused == 503 and body["error"]["code"] == "shutting_down"
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text.strip() == ("word " * 40).strip()  # the whole answer, not cut


async def test_drain_timeout_ends_running_streams_with_an_error_event(llmd_home: Path) -> None:
    async with api(llmd_home, token_delay=0.1) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "word " * 100, "stream": True},
        )
        await drain(client.server.app, timeout=0.3)
        events = await sse_events(resp)
    assert events[-1]["error"]["code"] == "shutting_down"
    assert "shutting down" in events[-1]["error"]["message"]


async def test_status_does_not_wait_on_a_wedged_worker(llmd_home: Path) -> None:
    """A worker that stops answering (SIGSTOP, a call holding its loop) is reported as such
    within /status's own short timeout, not after the health ping gives up on it."""
    policy = RestartPolicy(first_backoff=0.01, health_interval=30, hang_timeout=60)
    async with api(llmd_home, app_options={"restart_policy": policy}) as client:
        await complete(client, prompt="load")
        hung = asyncio.create_task(complete(client, prompt="hang", seed=668))
        await asyncio.sleep(0.3)  # the fake worker now blocks its event loop
        started = time.monotonic()
        info = await status_of(client)
        took = time.monotonic() - started
        hung.cancel()
    assert took < 3
    assert "did not answer" in info["models"][0]["engine_error"]
