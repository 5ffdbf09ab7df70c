"""``GET /metrics``: the daemon's Prometheus metrics (text exposition format).

The app's `Metrics` (``runtime/counters.py``) is rendered here, from three sources:

- events, counted as they happen: HTTP requests (a middleware here, outermost, so it sees the
  final status of every request), each generation's tokens and latencies (a
  `GenerationObserver`, made by generation.generate_text, which every protocol's generation
  goes through) and worker restarts (the supervisor);
- scrape-time reads of the loaded models' engines (`WorkerClient.stats`), the registry, the
  session table and the pull downloader, taken by the async handler just before rendering;
- nothing else: no module-global state.

Labels stay bounded: ``route`` is the matched route's template (``/v1/sessions/{session_id}``,
``unmatched`` when none matched), ``method`` one of the HTTP methods or ``other``, ``model``
a loaded model's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmd.api.http_common import METRICS, REGISTRY, SESSIONS, STREAM_DELIVERED
from llmd.api.pull_routes import PULLS
from llmd.api.remote_routes import remote_status
from llmd.runtime.counters import Metrics
from llmd.runtime.supervisor import ModelSupervisor

STATS_TIMEOUT = 2.0  # a worker that does not answer within this is left out of one scrape

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


# ---------------------------------------------------------------------- HTTP


@web.middleware
async def metrics_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Counts every request with its final status; put it first (outside the error
    middleware). A streaming response counts when its handler returns, with the status it was
    sent with once its last frame is written (STREAM_DELIVERED), else 499 if the client left."""
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        # The client disconnected and aiohttp cancelled the handler: 499, unless it had already
        # read the whole stream (hung up during the handler's teardown).
        status = request.get(STREAM_DELIVERED, 499)
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        request.app[METRICS].http_requests.labels(route, method, str(status)).inc()


# ---------------------------------------------------------------------- scrape


async def _engine_stats(model: ModelSupervisor) -> dict[str, Any] | None:
    worker = model.worker
    if worker is None or worker.dead is not None or worker.ready is None:
        return None
    try:
        stats = await worker.stats(timeout=STATS_TIMEOUT)
    except Exception:  # noqa: BLE001 - a busy or dead worker is left out of this scrape
        return None
    return {**stats.model_dump(exclude={"type", "extra"}), **stats.extra}


def _field(stats: dict[str, Any] | None, path: str) -> Any:
    """stats["a"]["b"] for "a.b" (the engine nests the disk tier's counters); None if absent."""
    value: Any = stats
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


async def scrape(app: web.Application) -> list[Metric]:
    """The scrape-time families: models, their engines, sessions, pulls."""
    models = app[REGISTRY].loaded()
    stats = await asyncio.gather(*(_engine_stats(m) for m in models))

    loaded = _gauge("llmd_loaded_models", "Models loaded (in any state, failed included).")
    loaded.add_metric([], len(models))
    state = _gauge(
        "llmd_model_loaded", "1 for each loaded model, labelled with its state.", ["model", "state"]
    )
    active = _gauge("llmd_active_requests", "HTTP requests using the model now.", ["model"])
    budget = _gauge(
        "llmd_kv_budget_bytes", "KV cache memory the model's engine may use.", ["model"]
    )
    for m in models:
        state.add_metric([m.name, m.state.value], 1)
        active.add_metric([m.name], m.active)
        ready = m.worker.ready if m.worker is not None else None
        if ready is not None:
            budget.add_metric([m.name], ready.kv_budget_bytes)
    families: list[Metric] = [loaded, state, active, budget]

    # (stats field, kind, metric name, help): only what the engine reports is exported.
    engine_fields = [
        ("queued_requests", "gauge", "llmd_queued_requests", "Requests waiting for a sequence slot."),
        ("active_sequences", "gauge", "llmd_running_sequences", "Sequences the engine is running."),
        ("kv_bytes", "gauge", "llmd_kv_cache_bytes", "KV cache memory allocated by the engine."),
        ("kv_blocks_used", "gauge", "llmd_kv_blocks_used", "KV cache blocks in use (running sequences and cache)."),
        ("kv_idle_cached_blocks", "gauge", "llmd_kv_idle_cached_blocks", "Cached KV blocks no running sequence uses (evictable)."),
        ("prefix_cache_blocks", "gauge", "llmd_prefix_cache_blocks", "KV blocks indexed by the prefix cache."),
        ("pinned_sessions", "gauge", "llmd_pinned_sessions", "Named sessions holding KV in the engine."),
        ("tokens_generated", "counter", "llmd_engine_generated_tokens", "Tokens the engine generated since its worker started (warmup included)."),
        ("prompt_tokens_processed", "counter", "llmd_engine_prefill_tokens", "Prompt tokens the engine prefilled (not served from the prefix cache) since its worker started."),
        ("prefix_cache_hits", "counter", "llmd_prefix_cache_hits", "Requests that reused cached KV since the worker started."),
        ("prefix_cached_tokens", "counter", "llmd_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache since the worker started."),
        ("images_encoded", "counter", "llmd_images_encoded", "Images the vision tower encoded since the worker started (not those served from its cache of recent images)."),
        ("image_encode_seconds", "counter", "llmd_image_encode_seconds", "Seconds the vision tower spent encoding images since the worker started."),
        ("image_cache_hits", "counter", "llmd_image_cache_hits", "Images whose embeddings came from the worker's cache of recent images since it started."),
        ("draft_declined_tokens", "counter", "llmd_speculative_declined_tokens", "Draft tokens on offer that speculative decoding's cost model did not verify (their rows were expected to cost more time than they would save) since the worker started."),
        ("draft_cached_tokens", "counter", "llmd_speculative_draft_cached_tokens", "Prompt tokens whose draft-model KV came from the draft model's own prefix cache (not run through the draft model again) since the worker started."),
        ("embedding_requests", "counter", "llmd_engine_embedding_sequences", "Embedding and rerank sequences the engine completed since its worker started."),
        ("kv_disk.hits", "counter", "llmd_kv_disk_hits", "Requests that loaded KV blocks from the disk tier since the worker started."),
        ("kv_disk.hit_tokens", "counter", "llmd_kv_disk_hit_tokens", "Prompt tokens whose KV was loaded from the disk tier since the worker started."),
        ("kv_disk.loads", "counter", "llmd_kv_disk_loads", "Requests whose prefix was read from the disk tier off the engine thread since the worker started."),
        ("kv_disk.steps_during_loads", "counter", "llmd_kv_disk_steps_during_loads", "Engine steps that ran while a disk-tier load was in flight since the worker started."),
        ("kv_disk.read_bytes", "counter", "llmd_kv_disk_read_bytes", "KV bytes read from the disk tier since the worker started."),
        ("kv_disk.written_bytes", "counter", "llmd_kv_disk_written_bytes", "Bytes the worker wrote to the KV disk tier since it started."),
        ("kv_disk.dropped_blocks", "counter", "llmd_kv_disk_dropped_blocks", "KV blocks not written to disk (write queue full or disk failing) since the worker started."),
        ("kv_disk.corrupt_files", "counter", "llmd_kv_disk_corrupt_files", "KV disk files that failed their checksum (deleted, never served) since the worker started."),
        ("kv_disk.bytes", "gauge", "llmd_kv_disk_bytes", "Bytes in the KV disk tier (all models), as the worker last counted."),
    ]  # fmt: skip
    for field, kind, name, doc in engine_fields:
        family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = family_type(name, doc, labels=["model"])
        for m, st in zip(models, stats, strict=True):
            value = _field(st, field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family.add_metric([m.name], value)
        families.append(family)
    ratio = _gauge(
        "llmd_prefix_cache_hit_ratio",
        "Share of prompt tokens served from the prefix cache since the worker started.",
        ["model"],
    )
    for m, st in zip(models, stats, strict=True):
        if st is not None and "prefix_cached_tokens" in st and "prompt_tokens_processed" in st:
            hit, prefilled = st["prefix_cached_tokens"], st["prompt_tokens_processed"]
            ratio.add_metric([m.name], hit / (hit + prefilled) if hit + prefilled else 0.0)
    families.append(ratio)
    pooled = _gauge(
        "llmd_engine_max_embeddings_in_a_step",
        "Most embedding or rerank sequences that one engine step finished together since the "
        "worker started (above 1: the inputs of a request were batched).",
        ["model"],
    )
    for m, st in zip(models, stats, strict=True):
        histogram = st.get("pooled_rows_histogram") if st is not None else None
        if isinstance(histogram, dict):
            pooled.add_metric([m.name], max((int(k) for k in histogram), default=0))
    families.append(pooled)

    sessions = _gauge("llmd_sessions", "Named sessions open.")
    sessions.add_metric([], len(app[SESSIONS].list()))
    pulled = CounterMetricFamily(
        "llmd_pull_bytes", "Bytes downloaded from model hubs by pulls since the daemon started."
    )
    pulled.add_metric([], app[PULLS].downloader.bytes_received if PULLS in app else 0)
    pulls = _gauge("llmd_pulls_running", "Pulls running now.")
    pulls.add_metric([], len(app[PULLS].jobs) if PULLS in app else 0)
    families += [sessions, pulled, pulls]
    families += await _remote_families(app)
    return families


async def _remote_families(app: web.Application) -> list[Metric]:
    """Each remote's health (1 up, 0 down; absent before its first check) and its requests
    in flight and queued now."""
    up = _gauge(
        "llmd_remote_up", "1 when the remote's last health check passed, else 0.", ["remote"]
    )
    running = _gauge(
        "llmd_remote_in_flight", "Requests the remote's upstream is answering now.", ["remote"]
    )
    queued = _gauge(
        "llmd_remote_queued", "Requests waiting for one of the remote's slots.", ["remote"]
    )
    try:
        remotes = await asyncio.to_thread(remote_status, app)
    except KeyError:  # an app built without remote routes
        remotes = []
    for r in remotes:
        if r["healthy"] is not None:
            up.add_metric([r["name"]], 1 if r["healthy"] else 0)
        running.add_metric([r["name"]], r["in_flight"])
        queued.add_metric([r["name"]], r["queued"])
    return [up, running, queued]


async def metrics_handler(request: web.Request) -> web.Response:
    app = request.app
    body = app[METRICS].render(await scrape(app))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics(app: web.Application, metrics: Metrics) -> None:
    """Register ``GET /metrics`` serving `metrics` (whose middleware the app was built with)."""
    app[METRICS] = metrics
    app.router.add_get("/metrics", metrics_handler, allow_head=False)
