"""Health checks of remote models: the daemon asks each upstream's `/v1/models` now and then,
so `llmd status` says a remote is down before a user's request finds out, and the context
length shown in listings follows the upstream's (a vLLM restarted with another
`--max-model-len`). A check is the same probe `llmd remote add` makes (remotes.probe).

Schedule: every `interval` seconds while an upstream answers; after failures, sooner at
first and then backing off (5 s, 10 s, 20 s, ... up to `max_backoff`), so a dead upstream is
noticed back quickly without being hammered. Checks never block requests: a request is sent
whatever the last check said.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from llmd.runtime.remote_upstream import RemoteGate
from llmd.store.remotes import RemoteError, RemoteRecord, RemoteStore, probe

log = logging.getLogger("llmd.remote")

DEFAULT_INTERVAL = 30.0
FIRST_RETRY = 5.0
DEFAULT_MAX_BACKOFF = 300.0


async def check(
    gate: RemoteGate,
    remote: RemoteRecord,
    *,
    interval: float = DEFAULT_INTERVAL,
    max_backoff: float = DEFAULT_MAX_BACKOFF,
) -> None:
    """One check of `remote`; its result and next due time go into the gate's health."""
    health = gate.health(remote.name)
    try:
        checked = await probe(remote)
    except RemoteError as exc:
        if health.healthy is not False or health.failures == 0:
            log.warning("remote %s is unhealthy: %s", remote.name, exc.message)
        health.healthy, health.last_error = False, exc.message
        health.failures += 1
        delay = min(FIRST_RETRY * 2 ** (health.failures - 1), max_backoff)
    else:
        if health.healthy is False:
            log.info("remote %s is healthy again", remote.name)
        health.healthy, health.last_error, health.failures = True, None, 0
        health.context_length = checked.context_length
        health.capabilities = checked.capabilities
        delay = interval
    health.checked_at = time.time()
    health.next_check = health.checked_at + delay


async def run_health_checks(
    store: RemoteStore,
    gate: RemoteGate,
    *,
    tick: float = 1.0,
    interval: float = DEFAULT_INTERVAL,
    max_backoff: float = DEFAULT_MAX_BACKOFF,
) -> None:
    """Check every remote that is due, every `tick` seconds, until cancelled. A remote added
    while the daemon runs is due at once."""
    while True:
        try:
            remotes = await asyncio.to_thread(store.list)
            gate.forget({r.name for r in remotes})
            now = time.time()
            due = [r for r in remotes if gate.health(r.name).next_check <= now]
            await asyncio.gather(
                *(check(gate, r, interval=interval, max_backoff=max_backoff) for r in due)
            )
        except Exception:  # noqa: BLE001 - the checker must outlive any one failure
            log.exception("remote health check failed")
        await asyncio.sleep(tick)


def add_health_checks(app: web.Application, store: RemoteStore, gate: RemoteGate) -> None:
    """Run the checks for the app's lifetime."""

    async def background(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run_health_checks(store, gate))
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app.cleanup_ctx.append(background)
