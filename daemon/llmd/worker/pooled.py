"""The worker's side of `embed` requests: the engine runs each prompt as a sequence of its own
(``{id}#{i}``), all queued in one call so they are admitted into the same steps; the daemon
gets a `pooled` message per prompt as it ends, then one `done`, or one `error`.

Shared by the worker's two threads (the command reader submits and cancels, the event pump
collects), hence the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from llmd.runtime import protocol as p
from llmd.store.dense_modules import DenseHead

SEP = "#"


@dataclass
class _Request:
    n: int
    normalize: bool = False  # after the Dense head, when the model has one
    token_logits: bool = False  # rerank scores: no head applies
    ended: set[int] = field(default_factory=set)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cancelled: bool = False
    queued_ms: float = 0.0
    prefill_ms: float = 0.0


class PooledRequests:
    """Embed requests in flight, by the daemon's request id."""

    def __init__(self, head: DenseHead | None = None) -> None:
        # The model's Dense modules: the engine pools without normalising, then the head
        # projects and normalises here (store/dense_modules.py).
        self._head = head
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        # Failed requests: how many of their prompts' events are still to come (swallowed).
        self._failed: dict[str, int] = {}

    def submit(self, engine: Any, msg: p.Embed) -> None:
        projected = self._head is not None and msg.output == "embedding"
        with self._lock:
            self._requests[msg.id] = _Request(
                len(msg.prompts), normalize=msg.normalize, token_logits=msg.output != "embedding"
            )
        engine.submit_pooled(
            [f"{msg.id}{SEP}{i}" for i in range(len(msg.prompts))],
            msg.prompts,
            output=msg.output,
            pooling=msg.pooling,
            normalize=msg.normalize and not projected,
            logit_tokens=msg.logit_tokens,
        )

    def forget(self, rid: str) -> None:
        with self._lock:
            self._requests.pop(rid, None)

    def cancel(self, engine: Any, rid: str) -> bool:
        """Cancels every prompt of `rid`; False when `rid` is no embed request."""
        with self._lock:
            request = self._requests.get(rid)
            if request is None:
                return False
            pending = [i for i in range(request.n) if i not in request.ended]
        for i in pending:
            engine.cancel(f"{rid}{SEP}{i}")
        return True

    def on_event(self, engine: Any, ev: dict[str, Any]) -> tuple[bool, list[p.WorkerMessage]]:
        """(whether `ev` belongs to an embed request, the messages to send the daemon now)."""
        rid, sep, index = str(ev["id"]).rpartition(SEP)
        if not sep or not index.isdigit():
            return False, []
        with self._lock:
            request = self._requests.get(rid)
            if request is None:
                if rid not in self._failed:
                    return False, []  # no embed request's
                if ev["type"] in ("done", "error"):
                    self._failed[rid] -= 1
                    if self._failed[rid] <= 0:
                        del self._failed[rid]
                return True, []
            if ev["type"] == "error":
                del self._requests[rid]
                pending = [i for i in range(request.n) if i not in request.ended]
                if len(pending) > 1:
                    self._failed[rid] = len(pending) - 1
            elif ev["type"] == "done":
                request.ended.add(int(index))
                out: list[p.WorkerMessage] = []
                if ev.get("values") is not None:
                    values = ev["values"]
                    if self._head is not None and not request.token_logits:
                        values = self._head.apply(values, request.normalize)
                    out.append(p.Pooled(id=rid, index=int(index), values=values))
                request.prompt_tokens += ev["prompt_tokens"]
                request.cached_tokens += ev["cached_tokens"]
                request.cancelled |= ev["finish_reason"] == "cancelled"
                request.queued_ms = max(request.queued_ms, ev["timings"]["queued_ms"])
                request.prefill_ms = max(request.prefill_ms, ev["timings"]["prefill_ms"])
                if len(request.ended) < request.n:
                    return True, out
                del self._requests[rid]
                out.append(
                    p.Done(
                        id=rid,
                        finish_reason="cancelled" if request.cancelled else "stop",
                        prompt_tokens=request.prompt_tokens,
                        completion_tokens=0,
                        cached_tokens=request.cached_tokens,
                        timings=p.Timings(
                            queued_ms=request.queued_ms, prefill_ms=request.prefill_ms
                        ),
                    )
                )
                return True, out
            else:
                return True, []  # started: the daemon needs no admission report
        for i in pending:  # one prompt failed: the request failed, the others stop
            if i != int(index):
                engine.cancel(f"{rid}{SEP}{i}")
        message = f"input {index}: {ev['message']}" if request.n > 1 else ev["message"]
        return True, [p.Error(id=rid, code=ev["code"], message=message)]
