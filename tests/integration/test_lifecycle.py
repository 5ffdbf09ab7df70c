"""The daemon's lifecycle with the real worker and model, as separate processes: a worker
killed with SIGKILL mid-stream, 20 crash/restart cycles, `llmd start/status/stop` in a
private LLMD_HOME, stopping during a stream, the security checks over real TCP, and a soak of
32 streaming clients that hang up at random."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmd.limits import process_rss
from tests.conftest import LiveServer, run_llmd, short_home, start_server, stop_server

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

MODEL = "smollm2-135m"
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@pytest.fixture
def own_server(model_path: Path) -> Iterator[LiveServer]:
    """A daemon of this test's own (its workers get killed)."""
    home = short_home()
    live = start_server(home)
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


async def status(base: str, session: aiohttp.ClientSession) -> dict[str, Any]:
    async with session.get(base + "/status") as r:
        return await r.json()


async def chat(
    base: str, session: aiohttp.ClientSession, max_tokens: int = 4, **extra: Any
) -> tuple[int, dict[str, Any]]:
    body = {"model": MODEL, "messages": STORY, "max_tokens": max_tokens, **extra}
    async with session.post(base + "/v1/chat/completions", json=body) as r:
        return r.status, await r.json()


def worker_pid(info: dict[str, Any]) -> int | None:
    models = [m for m in info["models"] if m["name"] == MODEL]
    return models[0]["pid"] if models and models[0]["state"] == "ready" else None


async def wait_for_new_worker(base: str, session: aiohttp.ClientSession, old: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pid = worker_pid(await status(base, session))
        if pid is not None and pid != old:
            return pid
        await asyncio.sleep(0.1)
    raise AssertionError("the worker was not restarted within 60 s")


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append((int(entry.name), fields[0]))
    return out


def running_pids() -> set[int]:
    """Live (non-zombie) processes."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    size = process_rss(pid)
    assert size is not None, "no VmRSS"
    return size


async def test_a_worker_killed_mid_stream_ends_the_stream_within_2s_and_the_next_request_works(
    own_server: LiveServer,
) -> None:
    base = own_server.base_url
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "messages": STORY, "max_tokens": 400, "stream": True}
        async with session.post(base + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            events: list[Any] = []
            killed_at = 0.0
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                events.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
                if len(events) == 3:  # mid-answer
                    pid = worker_pid(await status(base, session))
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
            ended_after = time.monotonic() - killed_at
        code, answer = await chat(base, session)
        info = await status(base, session)
    assert killed_at and ended_after < 2.0
    assert "[DONE]" not in events
    assert events[-1]["error"]["code"] == "worker_died"
    assert "SIGKILL" in events[-1]["error"]["message"]
    assert code == 200 and answer["choices"][0]["message"]["content"]
    assert info["models"][0]["restarts"] == 1


async def test_20_crash_restart_cycles_leave_no_zombies_or_leaked_fds(
    own_server: LiveServer,
) -> None:
    base = own_server.base_url
    daemon = own_server.proc.pid
    async with aiohttp.ClientSession() as session:
        code, _ = await chat(base, session)
        assert code == 200
        pid = worker_pid(await status(base, session))
        assert pid is not None
        baseline_fds = open_fds(daemon)
        for _ in range(20):
            os.kill(pid, signal.SIGKILL)
            pid = await wait_for_new_worker(base, session, pid)
            code, _ = await chat(base, session)
            assert code == 200
        info = await status(base, session)
        fds = open_fds(daemon)
        kids = children(daemon)
    assert info["models"][0]["restarts"] == 20
    assert info["models"][0]["state"] == "ready"  # served between crashes: not a crash loop
    assert kids == [(pid, kids[0][1])] and kids[0][1] != "Z"  # only the live worker
    assert fds <= baseline_fds + 2  # a leak would grow with every cycle


def llmd(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_llmd({**os.environ, "LLMD_HOME": str(home)}, *args, timeout=timeout)


@pytest.fixture
def home() -> Iterator[Path]:
    path = short_home()
    yield path
    llmd(path, "stop", "--force", "--timeout", "20")
    shutil.rmtree(path, ignore_errors=True)


def test_start_status_stop_round_trip(home: Path, model_path: Path) -> None:
    started = llmd(home, "start", "--port", "0", "--preload", MODEL)
    again = llmd(home, "start", "--port", "0")
    info = json.loads(llmd(home, "status", "--json").stdout)
    human = llmd(home, "status").stdout
    ps = llmd(home, "ps").stdout
    stopped = llmd(home, "stop")
    after = llmd(home, "status")
    assert started.returncode == 0, started.stderr
    assert "llmd started" in started.stdout and f"{MODEL}: ready" in started.stderr
    assert again.returncode == 0 and "already running" in again.stdout
    assert info["pid"] > 0 and any(a.startswith("unix:") for a in info["addresses"])
    assert any(a.startswith("http://127.0.0.1:") for a in info["addresses"])
    [model] = info["models"]
    assert model["state"] == "ready" and model["warmup"]["ms"] > 0
    assert model["expires_at"] is None  # preloaded: kept
    assert model["backend"] and model["rss_bytes"] > 0
    assert f"pid {info['pid']}" in human and MODEL in human
    assert MODEL in ps and "ready" in ps
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert after.returncode != 0 and "not running" in after.stderr
    assert not (home / "run" / "llmd.sock").exists()
    assert info["pid"] not in running_pids()  # exited (a zombie until init reaps it)
    assert (home / "logs" / "llmd.log").read_text().count("loaded smollm2-135m") == 1


def test_kv_type_flag_loads_quantized_kv_and_status_shows_it(home: Path, model_path: Path) -> None:
    """`llmd start --kv-type q8_0`: the model's worker stores q8_0 KV (its real bytes per
    token: 34 per 32 numbers), `status` and `ps` say so, and it answers a request."""
    started = llmd(home, "start", "--port", "0", "--kv-type", "q8_0", "--preload", MODEL)
    try:
        assert started.returncode == 0, started.stderr
        [model] = json.loads(llmd(home, "status", "--json").stdout)["models"]
        ps = llmd(home, "ps").stdout
        run = llmd(home, "run", MODEL, "--max-tokens", "8", "Say hi.")
    finally:
        llmd(home, "stop")
    assert model["kv_type"] == "q8_0"
    assert model["kv_bytes_per_token"] == 30 * 3 * 64 * 2 // 32 * 34
    assert any(MODEL in line and "q8_0" in line for line in ps.splitlines()), ps
    assert run.returncode == 0 and run.stdout.strip(), run.stderr


async def test_stop_during_a_stream_lets_the_stream_finish(home: Path, model_path: Path) -> None:
    assert llmd(home, "start", "--port", "0").returncode == 0
    sock = str(home / "run" / "llmd.sock")
    body = {"model": MODEL, "messages": STORY, "max_tokens": 60, "stream": True}
    events: list[Any] = []
    stopper: asyncio.Task[subprocess.CompletedProcess[str]] | None = None
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as session:
        async with session.post("http://llmd/v1/chat/completions", json=body) as resp:
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    events.append(line[6:])
                    if stopper is None:
                        stopper = asyncio.create_task(asyncio.to_thread(llmd, home, "stop"))
    assert stopper is not None
    stopped = await stopper
    assert events[-1] == "[DONE]"
    finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finish[-1] in ("stop", "length")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout


async def test_rebinding_hosts_bad_keys_and_big_bodies_are_refused_over_tcp(
    model_path: Path,
) -> None:
    home = short_home()
    live = start_server(home, "--api-key", "sekrit", "--max-body", "4096")
    sock = str(home / "run" / "llmd.sock")
    try:
        async with aiohttp.ClientSession() as session:
            base = live.base_url
            async with session.get(base + "/v1/models") as r:
                no_key = r.status, await r.json()
            auth = {"Authorization": "Bearer sekrit"}
            async with session.get(base + "/v1/models", headers=auth) as r:
                with_key = r.status
            rebind = {**auth, "Host": f"evil.example:{live.port}"}
            async with session.get(base + "/v1/models", headers=rebind) as r:
                rebound = r.status, await r.json()
            big = {"model": MODEL, "prompt": "x" * 8192}
            async with session.post(base + "/v1/completions", json=big, headers=auth) as r:
                too_big = r.status, await r.json()
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as unix:
            async with unix.get("http://llmd/v1/models") as r:
                over_socket = r.status
    finally:
        stop_server(live)
        shutil.rmtree(home, ignore_errors=True)
    assert no_key[0] == 401 and no_key[1]["error"]["code"] == "invalid_api_key"
    assert with_key == 200
    assert rebound[0] == 403 and rebound[1]["error"]["code"] == "host_not_allowed"
    assert too_big[0] == 413 and too_big[1]["error"]["code"] == "request_too_large"
    assert over_socket == 200  # the private socket needs no key


SOAK_SECONDS = float(os.environ.get("LLMD_SOAK_SECONDS", "60"))


async def _soak_client(
    base: str, rng: random.Random, deadline: float, counts: dict[str, int]
) -> None:
    """Streams until the deadline; hangs up after a random number of chunks half the time."""
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Tell me fact {rng.randrange(100)}."}],
                "max_tokens": rng.randrange(8, 64),
                "stream": True,
            }
            hang_up_after = rng.randrange(1, 12) if rng.random() < 0.5 else None
            async with session.post(base + "/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    counts[f"http_{resp.status}"] = counts.get(f"http_{resp.status}", 0) + 1
                    continue
                chunks = 0
                async for raw in resp.content:
                    if raw.startswith(b"data: "):
                        chunks += 1
                    if hang_up_after is not None and chunks >= hang_up_after:
                        resp.close()  # the client goes away mid-stream
                        counts["disconnected"] += 1
                        break
                else:
                    counts["completed"] += 1


async def test_soak_32_streaming_clients_that_hang_up_at_random_leaves_nothing_behind(
    own_server: LiveServer,
) -> None:
    base = own_server.base_url
    daemon = own_server.proc.pid
    async with aiohttp.ClientSession() as session:
        # Warm: the first load and a few requests settle the daemon's own allocations.
        for _ in range(3):
            assert (await chat(base, session))[0] == 200
        before = rss(daemon)
        counts = {"completed": 0, "disconnected": 0}
        deadline = time.monotonic() + SOAK_SECONDS
        rngs = [random.Random(seed) for seed in range(32)]
        await asyncio.gather(*(_soak_client(base, rng, deadline, counts) for rng in rngs))
        settle = time.monotonic() + 30
        while True:
            info = await status(base, session)
            engine = info["models"][0]["engine"]
            idle = engine["active_sequences"] == 0 and engine["queued_requests"] == 0
            if (idle and info["requests_in_flight"] == 0) or time.monotonic() > settle:
                break
            await asyncio.sleep(0.2)
        after = rss(daemon)
        code, _ = await chat(base, session)
    assert counts["completed"] > 0 and counts["disconnected"] > 0
    assert set(counts) == {"completed", "disconnected"}  # no request refused or failed
    assert engine["active_sequences"] == 0 and engine["queued_requests"] == 0
    assert engine["kv_blocks_used"] == engine["pinned_blocks"] == 0
    assert info["requests_in_flight"] == 0 and info["models"][0]["restarts"] == 0
    assert after <= before + max(32 << 20, before // 4), (before, after)
    assert code == 200
