"""One loaded model and the life of its worker processes: spawn, warm up, watch, restart.

Why here and not in the registry: the registry decides *which* models are loaded (keep-alive,
memory, LRU); this decides how one model stays served. A worker is warmed up (a short prefill
and decode, timed) before it takes traffic. A worker that dies, or stops answering health
pings, is restarted with exponential backoff; requests in flight on it end at once with a
503-class error, and requests arriving meanwhile wait for the new worker. A model whose
workers keep dying without completing a request is marked failed, with the worker's last
error, and refused with 503 until a retry delay passes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from llmd.errors import ApiError, server_error
from llmd.limits import process_rss
from llmd.runtime import protocol as p
from llmd.runtime.keep_alive import DEFAULT_KEEP_ALIVE
from llmd.runtime.speculative import speculative_status
from llmd.runtime.worker_client import WorkerClient, WorkerError
from llmd.store.manifests import ModelRecord
from llmd.store.model_kind import record_kind

if TYPE_CHECKING:
    from llmd.runtime.counters import Metrics

log = logging.getLogger("llmd.supervisor")


def context_warning(ready: p.Ready) -> str | None:
    """Why the served context is suspect: `--context-length` beyond the trained one is served
    (as llama-server's -c and Ollama's num_ctx allow), positions past it computed the same way,
    but the model never saw them in training."""
    trained = ready.model.context_length
    if trained <= 0 or ready.context_length <= trained:
        return None
    return (
        f"served with a context of {ready.context_length} tokens, beyond the {trained} it was "
        "trained on: answers that use positions past the trained context may degrade "
        "(quality there is not guaranteed)"
    )


WARMUP_TEXT = "Warm up: the quick brown fox jumps over the lazy dog."


class ModelState(str, enum.Enum):
    LOADING = "loading"  # worker starting (weights loading)
    WARMING = "warming"  # worker ready, warmup request running
    READY = "ready"
    RESTARTING = "restarting"  # the worker died; a new one starts after a backoff
    FAILED = "failed"  # crash loop: refused until `failed_until`
    STOPPED = "stopped"  # unloaded


@dataclass(frozen=True)
class RestartPolicy:
    """Backoff 0.5 s, 1 s, 2 s, ... up to `max_backoff` for consecutive failures (a worker
    that completed a request resets the count); `max_failures` in a row mark the model failed
    for `failed_retry_after` seconds. A worker silent to a health ping for `hang_timeout`
    seconds is killed (one engine step never takes that long)."""

    first_backoff: float = 0.5
    max_backoff: float = 30.0
    max_failures: int = 5
    failed_retry_after: float = 60.0
    health_interval: float = 5.0
    hang_timeout: float = 30.0
    warmup: bool = True

    def backoff(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.max_backoff, self.first_backoff * 2 ** (failures - 1))


class TextSide(Protocol):
    """What the runtime needs of a model's text side (the text layer's `TextModel`, which it
    loads and hands in): the warmup prompt's token ids. Everything else about text (template,
    stop tokens, detokenizing) is the text layer's own business, reached as `model.text`."""

    def encode(self, text: str) -> list[int]: ...


class ModelSupervisor:
    """A served model: the text side (daemon) and its current worker (tokens)."""

    def __init__(
        self,
        record: ModelRecord,
        text: TextSide,
        make_worker: Callable[[], WorkerClient],
        policy: RestartPolicy,
        *,
        keep_alive: float = DEFAULT_KEEP_ALIVE,
    ) -> None:
        self.record = record
        self.text = text
        self.policy = policy
        self._make_worker = make_worker
        self.worker: WorkerClient | None = None
        self.state = ModelState.LOADING
        self.loaded_at = time.time()
        self.last_used = time.time()
        self.keep_alive = keep_alive
        self.active = 0  # HTTP requests using this model now (never unloaded while > 0)
        self.restarts = 0
        self.failures = 0  # consecutive: workers that died or failed to load without serving
        self.failed_until = 0.0
        self.last_error: str | None = None
        self.warmup: dict[str, Any] | None = None
        self.load_ms = 0.0
        self._served_baseline = 0  # worker.completed after warmup: its own request
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._deaths_seen: weakref.WeakSet[WorkerClient] = weakref.WeakSet()
        self._stopped = False
        self.metrics: Metrics | None = None  # the app's (set by the registry): GET /metrics
        # `llmd serve --speculative`: the max_draft requests get by default (0: off).
        self.speculative_max_draft = 0
        # Its drafter ("ngram" or "draft_model"), the draft model's name when one is asked
        # for, and why that one is not loaded (a vocabulary that differs), if it is not.
        self.speculative_drafter = "ngram"
        self.draft_model = ""
        self.draft_problem = ""

    # ------------------------------------------------------------------ facts

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def context_length(self) -> int:
        assert self.worker is not None and self.worker.ready is not None
        return self.worker.ready.context_length

    def expires_at(self) -> float:
        """When the keep-alive unloads it (inf: never); not while requests run."""
        return self.last_used + self.keep_alive

    def footprint_bytes(self) -> int:
        """Memory the model holds or will hold: its weights file plus its KV budget."""
        kv = self.worker.ready.kv_budget_bytes if self.worker and self.worker.ready else 0
        return self.record.size + kv

    @property
    def starting(self) -> bool:
        """A worker is being started (or waiting out its backoff) right now."""
        return self._lock.locked()

    def touch(self, keep_alive: float | None) -> None:
        self.last_used = time.time()
        if keep_alive is not None:
            self.keep_alive = keep_alive

    # ------------------------------------------------------------------ serving

    async def ensure_ready(self) -> WorkerClient:
        """The live, warmed-up worker; starts one if none runs (503 when it cannot)."""
        worker = self.worker
        if worker is not None and worker.dead is None and self.state is ModelState.READY:
            return worker
        async with self._lock:
            worker = self.worker
            if worker is not None and worker.dead is None and self.state is ModelState.READY:
                return worker
            if self._stopped:
                raise server_error(
                    f"model '{self.name}' was unloaded", code="model_unloaded", status=503
                )
            if worker is not None and worker.dead is not None:
                self._handle_death(worker)
            if self.state is ModelState.FAILED and time.time() < self.failed_until:
                raise self._failed_error()
            return await self._start()

    def _failed_error(self) -> ApiError:
        wait = max(0.0, self.failed_until - time.time())
        return server_error(
            f"model '{self.name}' failed {self.failures} times in a row and is disabled for "
            f"{wait:.0f} more seconds; last error: {self.last_error}",
            code="model_failed",
            status=503,
        )

    async def _start(self) -> WorkerClient:
        """Spawn, wait for ready, warm up. Caller holds the lock."""
        # After a failed model's retry delay, one immediate try (a new failure re-disables it).
        delay = 0.0 if self.state is ModelState.FAILED else self.policy.backoff(self.failures)
        if delay:
            self.state = ModelState.RESTARTING
            await asyncio.sleep(delay)
        self.state = ModelState.LOADING
        worker = self._make_worker()
        started = time.perf_counter()
        try:
            ready = await worker.start()
            self.load_ms = (time.perf_counter() - started) * 1000
            self.state = ModelState.WARMING
            if self.policy.warmup:
                self.warmup = await self._warm_up(worker)
        except WorkerError as exc:
            await worker.stop()
            detail = exc.message
            tail = [line for line in worker.stderr_tail if line.strip()][-3:]
            if tail and exc.code == "worker_died":
                detail += " (last output: " + " | ".join(tail) + ")"
            self._record_failure(detail)
            log.warning("model %s failed to load: %s (%s)", self.name, detail, exc.code)
            if self.state is ModelState.FAILED:
                raise self._failed_error() from exc
            self.state = ModelState.RESTARTING
            raise server_error(
                f"model '{self.name}' failed to load: {detail}", code=exc.code, status=503
            ) from exc
        if self._stopped:  # unloaded while it loaded (daemon shutdown)
            await worker.stop()
            raise server_error(
                f"model '{self.name}' was unloaded", code="model_unloaded", status=503
            )
        self.worker = worker
        self._served_baseline = worker.completed
        self.state = ModelState.READY
        log.info(
            "loaded %s in %.0f ms (backend=%s kernels=%s threads=%d)%s%s",
            self.name,
            self.load_ms,
            ready.backend,
            ready.kernels.get("isa"),
            ready.threads,
            f"; vision tower ({ready.vision.architecture}) {ready.vision.load_ms:.0f} ms of it"
            if ready.vision
            else "",
            f"; warmup {self.warmup['ms']:.0f} ms" if self.warmup else "",
        )
        warning = context_warning(ready)
        if warning:
            log.warning("%s: %s", self.name, warning)
        self._watcher = asyncio.create_task(self._watch(worker))
        return worker

    async def _warm_up(self, worker: WorkerClient) -> dict[str, Any]:
        """A short prefill and decode, so the first user request does not pay for lazy
        initialisation (kernel selection, allocator growth, page faults on the weights)."""
        prompt = self.text.encode(WARMUP_TEXT)
        started = time.perf_counter()
        kind = record_kind(self.record)
        if kind.kind == "embed" or kind.pooling == "cls":
            # Embedding models and cross-encoders warm up as they serve: an encoder cannot
            # generate at all.
            embedded, _ = await worker.embed(
                [prompt], pooling=kind.pooling or "last", normalize=kind.normalize
            )
            return {
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "prompt_tokens": embedded.prompt_tokens,
                "completion_tokens": 0,
                "prefill_ms": round(embedded.timings.prefill_ms, 1),
                "decode_ms": 0.0,
            }
        done: p.Done | None = None
        async for event in worker.generate(
            prompt, max_tokens=4, sampling=p.SamplingParams(), stop_tokens=[], tag="warmup"
        ):
            if isinstance(event, p.Done):
                done = event
        assert done is not None
        return {
            "ms": round((time.perf_counter() - started) * 1000, 1),
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "prefill_ms": round(done.timings.prefill_ms, 1),
            "decode_ms": round(done.timings.decode_ms, 1),
        }

    def _record_failure(self, message: str) -> None:
        self.failures += 1
        self.last_error = message
        if self.failures >= self.policy.max_failures:
            self.state = ModelState.FAILED
            self.failed_until = time.time() + self.policy.failed_retry_after
            log.error(
                "model %s failed %d times in a row; disabled for %.0f s: %s",
                self.name,
                self.failures,
                self.policy.failed_retry_after,
                message,
            )

    async def _watch(self, worker: WorkerClient) -> None:
        """Health pings while the worker lives; on its unexpected death, a restart."""
        while not worker.exited.done():
            try:
                await asyncio.wait_for(asyncio.shield(worker.exited), self.policy.health_interval)
                break
            except asyncio.TimeoutError:
                pass
            try:
                await worker.stats(timeout=self.policy.hang_timeout)
            except asyncio.TimeoutError:
                log.error(
                    "worker of %s (pid %s) did not answer a health ping in %.0f s; killing it",
                    self.name,
                    worker.pid,
                    self.policy.hang_timeout,
                )
                worker.stderr_tail.append(
                    f"(killed: no answer to a health ping in {self.policy.hang_timeout:.0f} s)"
                )
                worker.kill()
            except WorkerError:
                pass  # it died: the loop sees `exited`
        await asyncio.shield(worker.exited)
        if self._handle_death(worker):
            asyncio.create_task(self._restart())

    def _handle_death(self, worker: WorkerClient) -> bool:
        """Book an unexpected worker death once (the watcher or a request may see it first);
        True when a restart is due."""
        if self._stopped or worker is not self.worker or worker in self._deaths_seen:
            return False
        self._deaths_seen.add(worker)
        assert worker.dead is not None
        if worker.completed > self._served_baseline:
            self.failures = 0  # it served: this is a crash, not a loop
        tail = [line for line in worker.stderr_tail if line.strip()][-3:]
        detail = f" (last output: {' | '.join(tail)})" if tail else ""
        self._record_failure(worker.dead.message + detail)
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.labels(self.name).inc()
        if self.state is ModelState.FAILED:
            return False
        self.state = ModelState.RESTARTING
        return True

    async def _restart(self) -> None:
        """Eager restart: retried (with the backoff in `_start`) until a worker is up, the
        model is marked failed, or it is unloaded."""
        while not self._stopped and self.state is not ModelState.FAILED:
            try:
                await self.ensure_ready()
                return
            except ApiError as exc:
                log.warning("restart of %s failed: %s", self.name, exc.message)

    async def stop(self, reason: WorkerError | None = None) -> None:
        """Unload: stop the worker (requests still on it end with `reason`)."""
        self._stopped = True
        self.state = ModelState.STOPPED
        if self._watcher is not None:
            self._watcher.cancel()
        if self.worker is not None:
            await self.worker.stop(reason=reason)

    async def unpin(self, session: str) -> None:
        if self.worker is not None:
            await self.worker.unpin(session)

    def describe(self) -> dict[str, Any]:
        """The model's part of `GET /status`."""
        worker = self.worker
        ready = worker.ready if worker is not None else None
        expires = self.expires_at()
        entry: dict[str, Any] = {
            "name": self.name,
            "state": self.state.value,
            "path": self.record.path,
            "pid": worker.pid if worker is not None and worker.dead is None else None,
            "loaded_at": int(self.loaded_at),
            "last_used": round(self.last_used, 3),
            "keep_alive_s": None if math.isinf(self.keep_alive) else self.keep_alive,
            "expires_at": None if math.isinf(expires) else round(expires, 3),
            "active_requests": self.active,
            "in_flight": worker.in_flight if worker is not None else 0,
            "restarts": self.restarts,
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "load_ms": round(self.load_ms, 1),
            "warmup": self.warmup,
            "footprint_bytes": self.footprint_bytes(),
        }
        if self.state is ModelState.FAILED:
            entry["retry_at"] = round(self.failed_until, 3)
        if ready is not None:
            entry.update(
                backend=ready.backend,
                device=ready.device,
                context_length=ready.context_length,
                trained_context_length=ready.model.context_length,
                max_sequences=ready.max_sequences,
                kv_budget_bytes=ready.kv_budget_bytes,
                kv_type=ready.kv_type,
                kv_bytes_per_token=ready.kv_bytes_per_token,
                kv_capacity_tokens=ready.kv_capacity_tokens,
                kv_disk_bytes=ready.kv_disk_bytes,
                memory=ready.memory,
                vision=ready.vision.model_dump() if ready.vision else None,
                speculative=speculative_status(
                    self.speculative_max_draft,
                    ready.features,
                    drafter=self.speculative_drafter,
                    draft_model=self.draft_model,
                    draft_problem=self.draft_problem,
                ),
            )
            warning = context_warning(ready)
            if warning:
                entry["context_warning"] = warning
        if worker is not None and worker.pid is not None and worker.dead is None:
            rss = process_rss(worker.pid)
            if rss is not None:
                entry["rss_bytes"] = rss
        return entry
