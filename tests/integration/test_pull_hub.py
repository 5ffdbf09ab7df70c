"""`llmd pull` end to end: the CLI, a real `llmd serve` with the real worker, and the fake hub
(tests/fakes/fake_hub.py) serving the test model and a Q5_0 copy of it over HTTP.

The Q5_0 copy (the type llama.cpp's K-quant recipes write for rows that are no multiple of 256)
runs on its own kernels, as downloaded; it must answer a chat like the original. The daemon is started *without* HF_ENDPOINT: the CLI passes its own,
as it must for a daemon that was started earlier (e.g. as a service)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from openai import OpenAI

from llmd.store.convert import convert_gguf, plan_with
from llmd.store.gguf_layout import read_layout
from tests.conftest import LiveServer, free_port, run_llmd, short_home, stop_server
from tests.fakes.fake_hub import FakeHub

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
MAMBA_REPO = "test-org/mamba-GGUF"
Q4, Q5 = "SmolLM2-135M-Instruct-Q4_1.gguf", "SmolLM2-135M-Instruct-Q5_0.gguf"
PROBE_SLACK = 8 << 20
PROMPT = "What is the capital of France? Answer in one sentence."  # as the llama.cpp fixtures


def unsupported_gguf(path: Path) -> Path:
    """A GGUF header of an architecture llmd's engine does not run."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "mamba")
    w.add_tensor("blk.0.ssm_in.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def make_q5_0(src: Path, dst: Path) -> Path:
    """The test model with its Q4_1 tensors re-quantized to Q5_0 (gguf's quantizer)."""
    layout = read_layout(src)
    changes = {t.name: (t.type, int(T.Q5_0)) for t in layout.tensors if t.type == T.Q4_1}
    convert_gguf(src, dst, layout, plan_with(layout, changes, src.stat().st_size))
    return dst


def _interruptible() -> None:
    """Popen's preexec_fn for the Ctrl-C tests: the pull CLI starts with SIGINT at its default
    and unblocked, as from a shell. A child inherits an ignored SIGINT (and the signal mask) from
    the test process, where an earlier test's in-process code may have left it so; Python then
    keeps ignoring it, and the pull ran to its end (exit 0) in the full suite."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _sigint_state() -> str:
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    return f"test process: SIGINT handler {signal.getsignal(signal.SIGINT)!r}, blocked {blocked}"


@pytest.fixture(scope="module")
def hub(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    q5 = make_q5_0(model_path, tmp_path_factory.mktemp("hub") / Q5)
    fake = FakeHub()
    fake.add_repo(REPO, {Q4: model_path, Q5: q5, "README.md": b"# SmolLM2 GGUF\n"})
    fake.add_repo(MAMBA_REPO, {"mamba-Q8_0.gguf": unsupported_gguf(q5.with_name("mamba.gguf"))})
    fake.start_in_thread()
    yield fake
    fake.stop_thread()


@pytest.fixture(scope="module")
def daemon(model_path: Path) -> Iterator[LiveServer]:
    home = short_home()
    port = free_port()
    log = home / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"LLMD_HOME": str(home), "HF_HOME": str(home / "hf")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmd", "serve", "--port", str(port)],
        env=env,
        stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"llmd serve did not start: {log.read_text()}") from None
            time.sleep(0.2)
    live = LiveServer(home, port, proc, log)
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


def llmd(
    daemon: LiveServer, hub: FakeHub, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`llmd ARGS` as a user runs it (its own process, its own terminal signals)."""
    env = {**daemon.env, "HF_ENDPOINT": hub.endpoint, "COLUMNS": "100"}
    return run_llmd(env, *args, timeout=timeout)


def cli(daemon: LiveServer, *args: str, **env: str) -> Any:
    """`llmd ARGS` in this process (no interpreter start-up per call)."""
    from click.testing import CliRunner

    from llmd.cli.main import main

    return CliRunner().invoke(main, list(args), env={"LLMD_HOME": str(daemon.home), **env})


def chat(daemon: LiveServer, model: str) -> str:
    client = OpenAI(base_url=daemon.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=12,
    )
    return r.choices[0].message.content or ""


def api(daemon: LiveServer, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(daemon.base_url + path, data=data)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_q5_0_gguf_runs_as_downloaded_and_answers_like_the_original(
    daemon: LiveServer, hub: FakeHub
) -> None:
    name = f"hf.co/{REPO}:Q5_0"
    out = llmd(daemon, hub, "pull", name)
    assert out.returncode == 0, out.stderr
    assert "pulling manifest" in out.stderr and "verifying sha256 digest" in out.stderr
    assert "B/s" in out.stderr  # the progress bar's rate
    assert "convert" not in out.stderr + out.stdout  # Q5_0 has kernels: nothing to convert
    assert f"installed {name} (gguf, Q5_0," in out.stdout

    row = next(line for line in cli(daemon, "list").output.splitlines() if name in line)
    assert row.split()[1:3] == ["gguf", "Q5_0"]
    shown = cli(daemon, "show", name).output
    for fact in (
        "architecture      llama",
        "context length    8192",
        "license           apache-2.0",
    ):
        assert fact in shown
    assert "Q5_0" in shown and "<|im_start|>" in shown  # quantization, template

    converted, original = chat(daemon, name), chat(daemon, "smollm2-135m")
    assert "Paris" in converted
    assert converted.split()[:5] == original.split()[:5], (converted, original)

    refused = cli(daemon, "rm", name)
    assert refused.exit_code == 1 and "loaded in the running daemon" in refused.output
    assert cli(daemon, "rm", "--force", name).exit_code == 0
    assert name not in cli(daemon, "list").output


def test_two_clients_share_one_download_and_ctrl_c_leaves_it_running(
    daemon: LiveServer, hub: FakeHub, model_path: Path
) -> None:
    name = f"hf.co/{REPO}:Q4_1"
    size = model_path.stat().st_size
    hub.chunk_delay = 0.004  # ~1.6 s for the file: the two pulls overlap
    try:
        env = {**daemon.env, "HF_ENDPOINT": hub.endpoint}
        cmd = [sys.executable, "-m", "llmd", "pull", name]
        procs = [
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        results = [p.communicate(timeout=120) for p in procs]
        for p, (stdout, stderr) in zip(procs, results, strict=True):
            assert p.returncode == 0, stderr
            assert f"installed {name}" in stdout
        assert size <= hub.served[Q4] <= size + 2 * PROBE_SLACK  # one download for both

        assert cli(daemon, "rm", name).exit_code == 0
        before = hub.served[Q4]
        # Slow enough (~8 s for the file) that Ctrl-C lands mid-download even on a loaded
        # machine: at 1.6 s a busy CI box once let the pull finish before the signal was sent.
        hub.chunk_delay = 0.02
        state = _sigint_state()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_interruptible,
        )
        deadline = time.monotonic() + 30
        while hub.served[Q4] - before < 20_000_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        hub.chunk_delay = 0.004
        assert proc.returncode == 130 and "the pull goes on in the daemon" in stderr, (
            state,
            stderr,
        )
        status, running = api(daemon, "/v1/models/pulls")
        assert status == 200 and [j["model"] for j in running["data"]] == [name]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = json.loads(cli(daemon, "list", "--json").output)
            record = next((r for r in listed if r["name"] == name), None)
            if record:
                break
            time.sleep(0.2)
        assert record is not None, "the pull did not finish in the daemon"
        assert record["digest"] == f"sha256:{sha256(model_path)}"
        assert hub.served[Q4] - before <= size + PROBE_SLACK  # it carried on, no restart
    finally:
        hub.chunk_delay = 0.0


def test_errors_are_clear_from_the_cli_and_the_api(daemon: LiveServer, hub: FakeHub) -> None:
    out = cli(daemon, "pull", f"hf.co/{REPO}:Q2_K", HF_ENDPOINT=hub.endpoint)
    assert out.exit_code == 1
    assert "has no Q2_K GGUF file. Quantization tags it has: Q4_1, Q5_0" in out.output
    out = cli(daemon, "pull", f"hf.co/{MAMBA_REPO}:Q8_0", HF_ENDPOINT=hub.endpoint)
    assert out.exit_code == 1 and "'mamba' model; llmd's engine runs llama" in out.output

    missing = {"model": "hf.co/nobody/nothing", "stream": False, "endpoint": hub.endpoint}
    status, body = api(daemon, "/v1/models/pull", missing)
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert "repository nobody/nothing was not found" in body["error"]["message"]
    offline = {**missing, "endpoint": "http://127.0.0.1:9"}
    status, body = api(daemon, "/v1/models/pull", offline)
    assert status == 502 and body["error"]["code"] == "hub_unreachable"
    assert "HF_ENDPOINT" in body["error"]["message"]
    status, body = api(daemon, "/v1/models/pull", {"model": "no-such-model"})
    assert status == 404 and "not in llmd's catalog" in body["error"]["message"]
    status, body = api(daemon, "/v1/models/pull", {})
    assert status == 400 and body["error"]["param"] == "model"


def test_ndjson_stream_for_other_tools(daemon: LiveServer, hub: FakeHub) -> None:
    body = {"model": f"hf.co/{REPO}:Q4_1", "name": "via-api", "endpoint": hub.endpoint}
    req = urllib.request.Request(
        daemon.base_url + "/v1/models/pull", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.read().splitlines() if line.strip()]
    assert events[0] == {"status": "pulling manifest"} and events[-1]["status"] == "success"
    assert events[-1]["model"] == "via-api"
    copied = cli(daemon, "cp", "via-api", "via-api-2")
    assert copied.exit_code == 0, copied.output
    listed = {r["name"]: r for r in json.loads(cli(daemon, "list", "--json").output)}
    assert listed["via-api"]["path"] == listed["via-api-2"]["path"]  # one blob, two names
    for n in ("via-api", "via-api-2"):
        assert cli(daemon, "rm", n).exit_code == 0
    blobs = daemon.home / "data/models/blobs"
    (blobs / f"sha256-{'0' * 64}").write_bytes(b"an orphan")
    out = cli(daemon, "gc")
    assert out.exit_code == 0 and "deleted 1 unused blob(s)" in out.output


def test_pull_without_a_daemon_uses_a_temporary_one_and_ctrl_c_resumes_later(
    hub: FakeHub, model_path: Path
) -> None:
    home = short_home()
    name = f"hf.co/{REPO}:Q4_1"
    size = model_path.stat().st_size
    cmd = [sys.executable, "-m", "llmd", "pull", name]
    env = {**os.environ, "LLMD_HOME": str(home), "HF_ENDPOINT": hub.endpoint}
    try:
        hub.chunk_delay = 0.02  # ~8 s for the file: Ctrl-C lands mid-download even under load
        before = hub.served[Q4]
        state = _sigint_state()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_interruptible,
        )
        deadline = time.monotonic() + 60
        while hub.served[Q4] - before < 20_000_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        hub.chunk_delay = 0.004
        assert proc.returncode == 130 and "temporary" in stderr and "resumes it" in stderr, (
            state,
            stderr,
        )
        assert not (home / "run" / "llmd.sock").exists()  # the temporary daemon is gone
        blobs = home / "data/models/blobs"
        assert sorted(p.suffix for p in blobs.iterdir()) == [".json", ".partial"]
        assert not (home / "data/models/manifests").exists() or not any(
            (home / "data/models/manifests").iterdir()
        )

        hub.chunk_delay = 0.0
        done_before = hub.served[Q4]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"installed {name}" in out.stdout
        resumed = hub.served[Q4] - done_before
        assert resumed <= size - 15_000_000 + PROBE_SLACK  # only the rest was fetched
        assert [p.name for p in blobs.iterdir()] == [f"sha256-{sha256(model_path)}"]
    finally:
        hub.chunk_delay = 0.0
        shutil.rmtree(home, ignore_errors=True)
