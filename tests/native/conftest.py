"""Native-engine fixtures: one engine on the test model per test module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads((FIXTURES / "llamacpp_reference.json").read_text())


# The backend the shared engine runs: "cpu" here and in CI; on a GPU machine the same parity,
# isolation and prefix-cache tests run with LLMD_TEST_BACKEND=gpu (see bench/gpu/README.md).
TEST_BACKEND = os.environ.get("LLMD_TEST_BACKEND", "cpu")


@pytest.fixture(scope="module")
def engine(model_path: Path):  # type: ignore[no-untyped-def]
    native = pytest.importorskip("llmd._engine")
    return native.Engine(
        str(model_path), context_length=4096, max_sequences=8, backend=TEST_BACKEND
    )


def on_kernel_path(path: str, code: str, *args: str, timeout: float = 300) -> Any:
    """Runs `code` (a Python program printing JSON on its last line) in a child process whose
    engine uses kernel path `path` (LLMD_CPU_PATH picks the kernel table once, at import), and
    returns that JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "LLMD_CPU_PATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_all(engine, requests: dict[str, dict]) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """Submit every request at once, collect tokens and the done event of each."""
    for rid, r in requests.items():
        engine.submit(rid, **r)
    results = {rid: {"tokens": [], "done": None} for rid in requests}
    pending = set(requests)
    while pending:
        for ev in engine.poll(1000):
            res = results[ev["id"]]
            if ev["type"] == "tokens":
                res["tokens"] += ev["tokens"]
            else:
                res["done"] = ev
                pending.discard(ev["id"])
    return results


@contextmanager
def worker_process(
    model: Path, backend: str, **launch: Any
) -> Iterator[tuple[subprocess.Popen[bytes], dict]]:
    """`python -m llmd.worker` with the argv and environment the daemon gives it (its BLAS
    preload included: a preloaded library that cannot run on this CPU once killed every
    float-weight worker), yielded once it is ready with its ready message. Leaving the block
    shuts it down and checks it exited cleanly (its command loop was alive to read that).
    `launch`: more worker_command options (kv_type, ...)."""
    from llmd.runtime.worker_launch import worker_command

    cmd, env = worker_command(str(model), kv_budget_bytes=16 << 20, **launch)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with subprocess.Popen(
        [*cmd, "--backend", backend],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    ) as proc:
        assert proc.stdin and proc.stdout
        ready = json.loads(proc.stdout.readline())
        assert ready["type"] == "ready", ready
        yield proc, ready
        proc.stdin.write(b'{"type": "shutdown"}\n')
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0


def send(proc: subprocess.Popen[bytes], *messages: dict) -> None:
    assert proc.stdin
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
    proc.stdin.flush()


def read_event(proc: subprocess.Popen[bytes]) -> dict:
    assert proc.stdout
    return json.loads(proc.stdout.readline())


def generate_in_worker(
    model: Path, backend: str, prompt: list[int], max_tokens: int, **launch: Any
) -> tuple[dict, list[int]]:
    """One greedy generation in a real worker process (worker_process). Returns the ready
    message and the generated tokens."""
    request = {"type": "generate", "id": "g", "prompt": prompt, "max_tokens": max_tokens}
    with worker_process(model, backend, **launch) as (proc, ready):
        send(proc, request)
        tokens: list[int] = []
        started = read_event(proc)  # admission: the prefix-cache split
        assert started["type"] == "started" and started["prompt_tokens"] == len(prompt), started
        while (event := read_event(proc))["type"] != "done":
            assert event["type"] == "tokens", event
            tokens += event["tokens"]
    return ready, tokens
