"""GET /metrics of a live `llmd serve` with the real model: a streamed chat moves the token
counters by exactly its usage, adds a first-token latency and a 200 to the request counter, and
the engine's gauges are there. The server is shared with other tests: deltas, not totals."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"


def scrape(base_url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def test_streamed_chat_moves_the_metrics(server) -> None:  # type: ignore[no-untyped-def]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    # Load the model first so the "before" scrape already has its series.
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    before = scrape(server.base_url)

    usage = None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colours."}],
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens > 0
    # The HTTP counter is recorded when the handler returns, just after the last chunk reached
    # the client: on a loaded machine the first scrape can come before it, so wait for it.
    ok = {"route": "/v1/chat/completions", "method": "POST", "status": "200"}
    deadline = time.monotonic() + 10
    after = scrape(server.base_url)
    while value(after, "llmd_http_requests_total", **ok) == value(
        before, "llmd_http_requests_total", **ok
    ):
        assert time.monotonic() < deadline, (
            "the streamed request never reached llmd_http_requests_total"
        )
        time.sleep(0.05)
        after = scrape(server.base_url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("llmd_generated_tokens_total", model=MODEL) == usage.completion_tokens
    assert delta("llmd_prompt_tokens_total", model=MODEL) == usage.prompt_tokens
    assert delta("llmd_time_to_first_token_seconds_count", model=MODEL) == 1
    assert delta("llmd_request_duration_seconds_count", model=MODEL) == 1
    assert delta("llmd_http_requests_total", **ok) == 1

    labels = (("model", MODEL),)
    for gauge in ("llmd_running_sequences", "llmd_queued_requests", "llmd_kv_cache_bytes"):
        assert labels in after.get(gauge, {}), gauge
    assert labels in after["llmd_prefix_cache_hit_ratio"]
    assert 0.0 <= after["llmd_prefix_cache_hit_ratio"][labels] <= 1.0
    assert value(after, "llmd_loaded_models") >= 1
    assert value(after, "llmd_model_loaded", model=MODEL, state="ready") == 1
