"""The worker's bookkeeping of `embed` requests (worker/pooled.py): one engine sequence per
prompt, one `pooled` line per prompt, one `done` for the request; a failing prompt fails the
request once and cancels the others."""

from __future__ import annotations

from typing import Any

from llmd.runtime import protocol as p
from llmd.worker.pooled import PooledRequests


class FakeEngine:
    def __init__(self) -> None:
        self.submitted: list[tuple[list[str], list[list[int]]]] = []
        self.cancelled: list[str] = []

    def submit_pooled(self, ids: list[str], prompts: list[list[int]], **_: Any) -> None:
        self.submitted.append((ids, prompts))

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


def _done(rid: str, values: list[float] | None, tokens: int, reason: str = "stop") -> dict:
    ev = {
        "type": "done",
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": tokens,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "timings": {"queued_ms": 1.0, "prefill_ms": 2.0, "decode_ms": 0.0},
    }
    if values is not None:
        ev["values"] = values
    return ev


def test_one_line_per_prompt_then_one_done() -> None:
    engine, pooled = FakeEngine(), PooledRequests()
    pooled.submit(engine, p.Embed(id="e1", prompts=[[1, 2], [3, 4, 5]]))
    assert engine.submitted == [(["e1#0", "e1#1"], [[1, 2], [3, 4, 5]])]
    handled, first = pooled.on_event(engine, _done("e1#1", [0.5, 0.5], 3))
    assert handled and first == [p.Pooled(id="e1", index=1, values=[0.5, 0.5])]
    _, last = pooled.on_event(engine, _done("e1#0", [1.0, 0.0], 2))
    assert last[0] == p.Pooled(id="e1", index=0, values=[1.0, 0.0])
    assert isinstance(last[1], p.Done) and last[1].prompt_tokens == 5
    assert pooled.on_event(engine, {"type": "tokens", "id": "r7-1", "tokens": [3]}) == (False, [])


def test_a_failing_prompt_fails_the_request_once_and_cancels_the_rest() -> None:
    engine, pooled = FakeEngine(), PooledRequests()
    pooled.submit(engine, p.Embed(id="e2", prompts=[[1], [2], [3]]))
    error = {"type": "error", "id": "e2#1", "code": "invalid_request", "message": "bad token"}
    handled, out = pooled.on_event(engine, error)
    assert handled and out == [
        p.Error(id="e2", code="invalid_request", message="input 1: bad token")
    ]
    assert sorted(engine.cancelled) == ["e2#0", "e2#2"]
    for i in (0, 2):  # their cancelled ends are nobody's business any more
        assert pooled.on_event(engine, _done(f"e2#{i}", None, 1, "cancelled")) == (True, [])
    assert pooled.on_event(engine, _done("e2#0", None, 1)) == (False, [])  # forgotten


def test_cancel_reaches_every_unfinished_prompt() -> None:
    engine, pooled = FakeEngine(), PooledRequests()
    pooled.submit(engine, p.Embed(id="e3", prompts=[[1], [2]]))
    pooled.on_event(engine, _done("e3#0", [1.0], 1))
    assert pooled.cancel(engine, "e3") and engine.cancelled == ["e3#1"]
    _, out = pooled.on_event(engine, _done("e3#1", None, 1, "cancelled"))
    assert isinstance(out[-1], p.Done) and out[-1].finish_reason == "cancelled"
    assert not pooled.cancel(engine, "r5-1")  # a generation: the engine's own cancel
