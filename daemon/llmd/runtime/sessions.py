"""Named sessions: a client that sends `session_id` (or `X-Llmd-Session-Id`) gets its KV
pinned in the model's worker between turns, until the session has been idle for its TTL or is
deleted.

Why in the daemon: the worker only holds or releases blocks (`Unpin`); when to let go is policy
— the idle TTL (a default and a per-session `session_ttl`), the limit on how many sessions may
pin memory at once, and the `GET/DELETE /v1/sessions` routes.

A session never fails a request: when `max_sessions` are open, a new one unpins the least
recently used idle session (its KV stays in the prefix cache, evictable); when every open
session is running a request, the new request runs unpinned. Only the header named for llmd
pins (`X-Llmd-Session-Id`): opencode sends `x-session-id` on every request, and reading that
as llmd's extension pinned 64 of its sessions and refused the 65th.

Sessions outlive the daemon: the table is saved (`sessions.json` in the data dir) at every
change and at shutdown, and read back at start. Their KV is then in no worker, but the KV
cache's disk tier holds it (native/core/kv_disk.h): the next turn loads the history's blocks
from disk instead of prefilling them, and pins them again."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("llmd.sessions")

# A session id (and other client-chosen keys of the same kind): short, printable, no spaces.
SESSION_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


class Pinner(Protocol):
    """Where a session's KV lives: the served model (its current worker, across restarts)."""

    async def unpin(self, session: str) -> None: ...


class _NotLoaded:
    """The worker of a session read back after a restart: none holds its KV yet, so there
    is nothing to unpin until its next request pins it in a real worker."""

    async def unpin(self, session: str) -> None:
        return None


NOT_LOADED = _NotLoaded()
_SAVED_FIELDS = ("id", "model", "ttl", "created", "last_used", "requests")

DEFAULT_SESSION_TTL = 600.0  # seconds idle before a session's KV is released
DEFAULT_MAX_SESSIONS = 64


@dataclass
class Session:
    id: str
    model: str
    worker: Pinner
    ttl: float
    created: float
    last_used: float
    requests: int = 0
    active: int = 0  # requests of this session running now (never expired while > 0)
    previous_workers: list[Pinner] = field(default_factory=list)

    def expires_at(self) -> float:
        return self.last_used + self.ttl

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "session",
            "model": self.model,
            "created": int(self.created),
            "last_used": int(self.last_used),
            "ttl": self.ttl,
            "expires_at": int(self.expires_at()),
            "requests": self.requests,
            "active_requests": self.active,
        }


class SessionTable:
    def __init__(
        self,
        *,
        default_ttl: float = DEFAULT_SESSION_TTL,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        clock: Callable[[], float] = time.time,
        saved: Path | None = None,
    ) -> None:
        self.saved = saved  # where the table outlives the daemon (None: it does not)
        self._saved_text = ""
        self.default_ttl = default_ttl
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._unpinning: set[asyncio.Task[None]] = set()  # evictions in flight

    def begin(self, sid: str, model: str, worker: Pinner, ttl: float | None) -> Session | None:
        """Marks a request of session `sid` as running; creates the session if new, making
        room by unpinning the least recently used idle session. None when every open session
        is running (the request then runs unpinned). A session moving to another model lets
        go of its KV in the old one."""
        now = self.clock()
        s = self._sessions.get(sid)
        if s is None:
            if len(self._sessions) >= self.max_sessions and not self._evict_idle():
                log.info("all %d sessions are running: %s runs unpinned", self.max_sessions, sid)
                return None
            s = Session(sid, model, worker, ttl or self.default_ttl, now, now)
            self._sessions[sid] = s
        elif s.worker is not worker:
            if s.worker is not NOT_LOADED:
                s.previous_workers.append(s.worker)
            s.model, s.worker = model, worker
        if ttl:
            s.ttl = ttl
        s.requests += 1
        s.active += 1
        s.last_used = now
        return s

    def _evict_idle(self) -> bool:
        """Unpins the least recently used session that runs no request (False: none)."""
        idle = [s for s in self._sessions.values() if s.active == 0]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.last_used)
        del self._sessions[victim.id]
        log.info("session %s unpinned to make room (max_sessions %d)", victim.id, self.max_sessions)
        task = asyncio.get_running_loop().create_task(victim.worker.unpin(victim.id))
        self._unpinning.add(task)
        task.add_done_callback(self._unpinning.discard)
        return True

    async def end(self, s: Session) -> None:
        s.active -= 1
        s.last_used = self.clock()
        for old in s.previous_workers:
            await old.unpin(s.id)
        s.previous_workers.clear()

    def pinned_until(self, model: str) -> float:
        """When the last named session on `model` may expire (0: none): the model is kept
        loaded until then, so its sessions' KV outlives the model's keep-alive."""
        ends = [
            math.inf if s.active else s.expires_at()
            for s in self._sessions.values()
            if s.model == model
        ]
        return max(ends, default=0.0)

    def list(self) -> list[dict[str, Any]]:
        return [s.describe() for s in sorted(self._sessions.values(), key=lambda s: s.created)]

    async def delete(self, sid: str) -> bool:
        s = self._sessions.pop(sid, None)
        if s is None:
            return False
        await s.worker.unpin(sid)
        return True

    async def expire(self) -> list[str]:
        """Deletes idle sessions past their TTL; returns their ids."""
        now = self.clock()
        gone = [s.id for s in self._sessions.values() if s.active == 0 and s.expires_at() <= now]
        for sid in gone:
            await self.delete(sid)
        return gone

    async def run_expiry(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.expire()
            self.save()

    def save(self) -> None:
        """Writes the table to `saved` when it changed (atomically: a crash mid-write leaves
        the previous copy). Best effort: a read-only disk costs persistence, not service."""
        if self.saved is None:
            return
        rows = [{k: getattr(s, k) for k in _SAVED_FIELDS} for s in self._sessions.values()]
        text = json.dumps(rows, sort_keys=True)
        if text == self._saved_text:
            return
        tmp = self.saved.with_suffix(".tmp")
        try:
            self.saved.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, self.saved)
            self._saved_text = text
        except OSError as exc:
            log.warning("cannot save the sessions to %s: %s", self.saved, exc)

    def restore(self) -> int:
        """Reads back the sessions a previous daemon saved that have not expired since; their
        KV waits in the disk tier for their next request. Returns how many."""
        if self.saved is None:
            return 0
        try:
            rows = json.loads(self.saved.read_text())
        except (OSError, ValueError):
            return 0  # none saved yet, or an unreadable file: start empty
        now = self.clock()
        for row in rows if isinstance(rows, list) else []:
            try:
                s = Session(
                    id=str(row["id"]),
                    model=str(row["model"]),
                    worker=NOT_LOADED,
                    ttl=float(row["ttl"]),
                    created=float(row["created"]),
                    last_used=float(row["last_used"]),
                    requests=int(row["requests"]),
                )
            except (KeyError, TypeError, ValueError):
                continue
            if (
                SESSION_ID.match(s.id)
                and s.expires_at() > now
                and len(self._sessions) < self.max_sessions
            ):
                self._sessions[s.id] = s
        self._saved_text = ""
        return len(self._sessions)
