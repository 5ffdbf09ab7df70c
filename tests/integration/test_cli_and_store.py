"""The `llmd` command line and the model store, against the live server's LLMD_HOME."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from openai import OpenAI

from tests.conftest import run_llmd, short_home

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")


def llmd(server, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return run_llmd(server.env, *args, timeout=timeout)


def test_run_streams_an_answer_over_the_unix_socket(server) -> None:  # type: ignore[no-untyped-def]
    out = llmd(
        server, "run", "smollm2-135m", "What is the capital of France? Answer in one sentence."
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "temporary" not in out.stderr  # it used the running daemon


def test_unix_socket_is_private_and_answers(server) -> None:  # type: ignore[no-untyped-def]
    sock = server.home / "run" / "llmd.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(sock))

    conn = UnixConnection("llmd")
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read())["status"] == "ok"


def test_pull_default_offline_list_and_rm(server) -> None:  # type: ignore[no-untyped-def]
    pulled = llmd(server, "pull", "smollm2-135m")
    assert pulled.returncode == 0, pulled.stderr
    listed = json.loads(llmd(server, "list", "--json").stdout)
    record = next(r for r in listed if r["name"] == "smollm2-135m")
    blob = Path(record["path"])
    assert blob.parent.name == "blobs" and blob.name == "sha256-" + record["digest"].split(":")[1]
    # --force: an earlier test may have left the model loaded in the shared daemon
    assert llmd(server, "rm", "--force", "smollm2-135m").returncode == 0
    assert not blob.exists()
    assert "smollm2-135m" not in llmd(server, "list").stdout.split()


def test_pull_local_gguf_under_a_name_and_chat_with_it(server, model_path) -> None:  # type: ignore[no-untyped-def]
    pulled = llmd(server, "pull", str(model_path), "--name", "tiny-local")
    assert pulled.returncode == 0, pulled.stderr
    client = OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    assert "tiny-local" in [m.id for m in client.models.list().data]
    r = client.chat.completions.create(
        model="tiny-local",
        messages=[
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
        ],
        temperature=0,
        max_tokens=30,
    )
    assert "Paris" in r.choices[0].message.content
    refused = llmd(server, "rm", "tiny-local")  # loaded: refused without --force
    assert refused.returncode != 0 and "loaded in the running daemon" in refused.stderr
    assert llmd(server, "rm", "--force", "tiny-local").returncode == 0


def test_pull_errors_are_clear(server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = llmd(server, "pull", str(tmp_path / "missing.gguf"))
    assert out.returncode != 0 and "neither a catalog name, a hub repo" in out.stderr
    out = llmd(server, "rm", "never-installed")
    assert out.returncode != 0 and "not installed" in out.stderr


def test_help_is_useful(server) -> None:  # type: ignore[no-untyped-def]
    top = llmd(server, "--help").stdout
    for cmd in ("serve", "run", "pull", "list", "show", "rm", "cp", "gc"):
        assert cmd in top
        sub = llmd(server, cmd, "--help")
        assert sub.returncode == 0 and len(sub.stdout.splitlines()) > 3


def test_health_reports_version(server) -> None:  # type: ignore[no-untyped-def]
    with urllib.request.urlopen(server.base_url + "/health") as r:
        body = json.loads(r.read())
    from llmd import __version__

    assert body == {"status": "ok", "version": __version__}
    assert os.environ.get("LLMD_HOME") != str(server.home)  # tests never touch the user's home


def test_run_without_a_daemon_starts_a_temporary_one() -> None:
    home = short_home()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "llmd", "run", "smollm2-135m", "--max-tokens", "12", "Say hi."],
            env={**os.environ, "LLMD_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stderr
        assert "temporary" in out.stderr and out.stdout.strip()
        assert not (home / "run" / "llmd.sock").exists()  # it went away with the command
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def test_status_shows_the_loaded_model_and_its_engine(server) -> None:  # type: ignore[no-untyped-def]
    assert llmd(server, "run", "smollm2-135m", "Say hi.").returncode == 0  # loads the model
    out = llmd(server, "status", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    [model] = [m for m in info["models"] if m["name"] == "smollm2-135m"]
    assert model["backend"] == "llmd-cpu" and model["kv_budget_bytes"] > 0
    assert model["engine"]["steps"] > 0
    text = llmd(server, "status")
    assert "smollm2-135m: ready, llmd-cpu" in text.stdout


def test_status_shows_an_mlx_device_models_device_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The MLX device backend (Metal on a Mac, CUDA; here MLX's CPU device, the same allocator
    # interface) holds its weights in memory the worker's RSS does not show: `llmd status`
    # prints MLX's own counters for it.
    from tests.conftest import start_server, stop_server

    monkeypatch.setenv("LLMD_BACKEND", "mlx-cpu")
    home = short_home()
    live = start_server(home)
    try:
        # A few tokens: MLX's CPU device decodes this model at ~6 tokens/s.
        assert llmd(live, "run", "--max-tokens", "4", "smollm2-135m", "Say hi.").returncode == 0
        info = json.loads(llmd(live, "status", "--json").stdout)
        [model] = [m for m in info["models"] if m["name"] == "smollm2-135m"]
        assert model["backend"] == "mlx-cpu"
        assert model["engine"]["device_memory"]["active_bytes"] > 50 << 20
        text = llmd(live, "status").stdout
        assert "device memory " in text and " MiB in use, peak " in text, text
    finally:
        stop_server(live)
        import shutil

        shutil.rmtree(home, ignore_errors=True)
