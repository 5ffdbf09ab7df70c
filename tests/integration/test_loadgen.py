"""The benchmarks' load generator (bench/loadgen.py) against a live `llmd serve` with the real
model, for a few seconds, so that it cannot rot between benchmark runs. It checks what the
benchmark's figures are made of (every request answered, tokens and times recorded, the chat's
history growing and its prefix reused), never how fast: no timing thresholds."""

from __future__ import annotations

import pytest
from bench import loadgen

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")


@pytest.fixture
def target(server) -> loadgen.Target:  # type: ignore[no-untyped-def]
    return loadgen.Target("llmd", server.base_url, "smollm2-135m")


async def test_concurrent_streams_for_a_duration_and_a_request_count(
    target: loadgen.Target,
) -> None:
    load = await loadgen.run_load(target, 2, 8, duration=3.0, seed=7)
    assert len(load.requests) >= 2 and not load.failed, [r.error for r in load.failed]
    for r in load.requests:
        assert r.tokens > 0 and r.usage_tokens == r.tokens  # llmd streams usage
        assert r.ttft is not None and r.t_last is not None and r.t_last >= r.t_first
        assert r.prompt_tokens and r.text and r.tokens_until(r.t_end) == r.tokens
    m = load.metrics()
    assert m["tokens"] == sum(r.tokens for r in load.requests)
    assert m["window_s"] == pytest.approx(3.0) and m["aggregate_tok_s"] is not None
    assert m["ttft_s_p50"] is not None and m["ttft_s_p95"] >= m["ttft_s_p50"]
    assert m["decode_tok_s_p50"] is not None

    counted = await loadgen.run_load(target, 2, 4, requests=3, seed=8)
    assert len(counted.requests) == 3 and not counted.failed


async def test_multi_turn_chat_grows_its_history_and_times_every_turn(
    target: loadgen.Target,
) -> None:
    chat = await loadgen.run_chat(target, 3, 12, seed=9)
    assert len(chat.turns) == 3 and not chat.failed, [r.error for r in chat.failed]
    assert all(r.ttft is not None and r.tokens > 0 for r in chat.turns)
    prompts = [r.prompt_tokens for r in chat.turns]
    assert prompts[0] and prompts[0] < prompts[1] < prompts[2]
    m = chat.metrics()
    assert len(m["ttft_s_per_turn"]) == 3 and None not in m["ttft_s_per_turn"]
    # The history's KV is reused on later turns (llmd's prefix cache reports it as OpenAI does).
    last = chat.turns[-1]
    if last.cached_tokens is not None:
        assert 0 < last.cached_tokens < last.prompt_tokens
