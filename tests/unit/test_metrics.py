"""GET /metrics over the FAKE worker: Prometheus text that parses, request counters labelled
by route template and final status, token counters equal to what `usage` reported, latency
histograms, scrape-time model and engine gauges, and the API key guarding it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmd.api.security import SecurityConfig
from tests.unit.fake_api import MODEL, api


async def scrape(client: Any, **headers: str) -> dict[str, Any]:
    """name -> {labels tuple (sorted items) -> value} of every sample."""
    resp = await client.get("/metrics", headers=headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def test_metrics_after_a_chat_and_a_bad_request(llmd_home: Path) -> None:
    async with api(llmd_home) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}]},
        )
        assert resp.status == 200
        usage = (await resp.json())["usage"]
        bad = await client.post("/v1/chat/completions", data=b"{not json")
        assert bad.status == 400
        missing = await client.delete("/v1/sessions/nope")
        assert missing.status == 404
        nowhere = await client.get("/no/such/route")
        assert nowhere.status == 404
        m = await scrape(client)

    chat = {"route": "/v1/chat/completions", "method": "POST"}
    assert value(m, "llmd_http_requests_total", **chat, status="200") == 1
    assert value(m, "llmd_http_requests_total", **chat, status="400") == 1
    # The route template, not the path: one series whatever the session id.
    assert (
        value(
            m,
            "llmd_http_requests_total",
            route="/v1/sessions/{session_id}",
            method="DELETE",
            status="404",
        )
        == 1
    )
    assert value(m, "llmd_http_requests_total", route="unmatched", method="GET", status="404") == 1

    assert value(m, "llmd_prompt_tokens_total", model=MODEL) == usage["prompt_tokens"]
    assert value(m, "llmd_generated_tokens_total", model=MODEL) == usage["completion_tokens"]
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert value(m, "llmd_cached_prompt_tokens_total", model=MODEL) == cached
    assert value(m, "llmd_time_to_first_token_seconds_count", model=MODEL) == 1
    assert value(m, "llmd_request_duration_seconds_count", model=MODEL) == 1
    # Every token after the first has a gap (the end-of-turn token the worker counts in
    # usage is never sent as a token event).
    gaps = value(m, "llmd_inter_token_latency_seconds_count", model=MODEL)
    assert 0 < gaps <= usage["completion_tokens"] - 1

    assert value(m, "llmd_loaded_models") == 1
    assert value(m, "llmd_model_loaded", model=MODEL, state="ready") == 1
    assert value(m, "llmd_running_sequences", model=MODEL) == 0
    assert value(m, "llmd_queued_requests", model=MODEL) == 0
    assert value(m, "llmd_worker_restarts_total", model=MODEL) == 0
    assert value(m, "llmd_sessions") == 0
    assert value(m, "llmd_pull_bytes_total") == 0


async def test_metrics_are_per_app(llmd_home: Path) -> None:
    """Each app has its own registry: a second app starts from zero."""
    for _ in range(2):
        async with api(llmd_home) as client:
            resp = await client.get("/health")
            assert resp.status == 200
            m = await scrape(client)
        health = {"route": "/health", "method": "GET", "status": "200"}
        assert value(m, "llmd_http_requests_total", **health) == 1
        assert value(m, "llmd_loaded_models") == 0


async def test_metrics_need_the_api_key_and_only_answer_get(llmd_home: Path) -> None:
    options = {"security": SecurityConfig(api_key="sekrit")}
    async with api(llmd_home, app_options=options) as client:
        assert (await client.get("/metrics")).status == 401
        assert (
            await client.post("/metrics", headers={"Authorization": "Bearer sekrit"})
        ).status == 405
        m = await scrape(client, Authorization="Bearer sekrit")
    assert value(m, "llmd_http_requests_total", route="/metrics", method="GET", status="401") == 1
    assert value(m, "llmd_http_requests_total", route="unmatched", method="POST", status="405") == 1
