"""What the HTTP route modules share: the application's keys and the JSON body reader."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from .errors import bad_request
from .model_registry import ModelRegistry
from .security import SecurityConfig
from .sessions import SessionTable
from .store import ModelStore

REGISTRY = web.AppKey("registry", ModelRegistry)
SESSIONS = web.AppKey("sessions", SessionTable)
STORE = web.AppKey("store", ModelStore)
STARTED = web.AppKey("started", float)
DRAINING = web.AppKey("draining", asyncio.Event)
ADDRESSES = web.AppKey("addresses", list)
SECURITY = web.AppKey("security", SecurityConfig)
SESSION_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


async def json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc


async def start_stream(request: web.Request, content_type: str) -> web.StreamResponse:
    """A prepared streaming response (SSE or NDJSON) that proxies do not buffer."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": content_type,
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    return resp
