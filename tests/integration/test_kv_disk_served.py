"""The KV disk tier as a user meets it, with the real daemon, worker and model: a long prompt's
KV survives a worker crash and a daemon `llmd stop` / `llmd start` (named sessions included),
the second time is served from disk with the same greedy answer, and `/status` and `/metrics`
count the disk hits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import run_llmd, serving, short_home

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"
BLOCK = 64
# An agent's long system prompt: some 1,500 tokens, the same every turn.
SYSTEM = " ".join(
    f"Rule {i}: when the user asks about topic {i}, answer in {i % 5 + 1} sentences and cite "
    f"section {i * 7 % 31} of the handbook."
    for i in range(60)
)


def _body(question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 16,
        "temperature": 0,
        **extra,
    }


def llmd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_llmd({**os.environ, "LLMD_HOME": str(home)}, *args)


@pytest.fixture
def home() -> Iterator[Path]:
    path = short_home()
    yield path
    llmd(path, "stop", "--force", "--timeout", "20")
    shutil.rmtree(path, ignore_errors=True)


async def _post(session: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(base + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _engine(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(base + "/status") as r:
        [model] = [m for m in (await r.json())["models"] if m["name"] == MODEL]
    return model


async def _written(session: aiohttp.ClientSession, base: str, blocks: int) -> dict[str, Any]:
    """The model's status once its worker has written at least `blocks` blocks to disk."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        model = await _engine(session, base)
        if model.get("engine", {}).get("kv_disk", {}).get("written_blocks", 0) >= blocks:
            return model
        await asyncio.sleep(0.1)
    raise AssertionError(f"fewer than {blocks} blocks written: {model.get('engine')}")


def _cached(answer: dict[str, Any]) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_a_worker_crash_keeps_the_prompt_on_disk_and_metrics_count_the_hit(
    model_path,
) -> None:  # type: ignore[no-untyped-def]
    with serving() as live:
        base = live.base_url
        async with aiohttp.ClientSession() as session:
            cold = await _post(session, base, _body("Which rule covers topic 7?"))
            prompt = cold["usage"]["prompt_tokens"]
            model = await _written(session, base, prompt // BLOCK)
            assert model["engine"]["kv_disk"]["enabled"] and model["kv_disk_bytes"] > 0
            os.kill(model["pid"], signal.SIGKILL)
            # The next request waits for the supervisor's new worker (in the restart backoff).
            warm = await _post(session, base, _body("Which rule covers topic 7?"))
            restarted = await _engine(session, base)
            async with session.get(base + "/metrics") as r:
                metrics = await r.text()
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    assert _cached(cold) == 0
    assert restarted["restarts"] == 1 and restarted["pid"] != model["pid"]
    assert _cached(warm) == (prompt - 1) // BLOCK * BLOCK
    assert f'llmd_kv_disk_hits_total{{model="{MODEL}"}} 1.0' in metrics
    assert f'llmd_kv_disk_hit_tokens_total{{model="{MODEL}"}} {float(_cached(warm))}' in metrics


async def test_a_session_survives_llmd_stop_and_start(home: Path, model_path) -> None:  # type: ignore[no-untyped-def]
    started = llmd(home, "start", "--port", "0", "--preload", MODEL)
    assert started.returncode == 0, started.stderr
    sock = str(home / "run" / "llmd.sock")
    base = "http://llmd"
    turn = _body("Which rule covers topic 12?", session_id="agent-1", session_ttl=3600)
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as session:
        first = await _post(session, base, turn)
        await _written(session, base, first["usage"]["prompt_tokens"] // BLOCK)
    stopped = llmd(home, "stop")
    assert stopped.returncode == 0, stopped.stderr
    again = llmd(home, "start", "--port", "0")
    assert again.returncode == 0, again.stderr
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as session:
        async with session.get(base + "/v1/sessions") as r:
            sessions = (await r.json())["data"]
        second = await _post(session, base, turn)
        model = await _engine(session, base)
    assert [s["id"] for s in sessions] == ["agent-1"]
    assert sessions[0]["ttl"] == 3600 and sessions[0]["requests"] == 1
    prompt = first["usage"]["prompt_tokens"]
    assert _cached(second) == (prompt - 1) // BLOCK * BLOCK
    assert second["choices"][0]["message"] == first["choices"][0]["message"]
    assert model["engine"]["kv_disk"]["hits"] == 1
    assert model["engine"]["pinned_sessions"] == 1  # pinned again in the new worker
    listed = json.loads(llmd(home, "status", "--json").stdout)
    assert [s["id"] for s in listed["sessions"]] == ["agent-1"]
    human = llmd(home, "status").stdout
    assert f"1 hit(s), {_cached(second)} tokens loaded" in human, human
