"""The `llmd` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import click

from . import __version__
from .catalog import DEFAULT_MODEL
from .paths import DEFAULT_HOST, DEFAULT_PORT, get_paths
from .store import ModelStore, StoreError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmd")
def main() -> None:
    """llmd - a local LLM daemon with an OpenAI-compatible API.

    \b
    Quick start (offline, with the default model):
      llmd serve &                              # http://127.0.0.1:7477/v1
      llmd run smollm2-135m "Why is the sky blue?"

    State lives under your user data dir, or under $LLMD_HOME when set.
    """


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
@click.option("-v", "--verbose", is_flag=True, help="Log worker output and debug details.")
def serve(
    host: str,
    port: int,
    context_length: int | None,
    threads: int | None,
    max_body: int,
    verbose: bool,
) -> None:
    """Run the API server in the foreground (TCP and a Unix socket).

    Models load on their first request, in a worker process each.
    """
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
            )
        )
    except KeyboardInterrupt:
        pass


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
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmd", "serve", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _socket_alive(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(
                    "could not start a daemon (try `llmd serve -v` to see why)"
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
@click.argument("model", default=DEFAULT_MODEL)
@click.argument("prompt")
@click.option("--max-tokens", type=int, default=None, help="Most tokens to generate.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--system", default=None, help="A system message.")
def run(
    model: str, prompt: str, max_tokens: int | None, temperature: float, system: str | None
) -> None:
    """Ask MODEL one question and stream the answer to stdout."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    body = {"model": model, "messages": messages, "stream": True, "temperature": temperature}
    if max_tokens:
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
    """Install a model: a catalog name (smollm2-135m), a local .gguf file or an HF directory."""
    try:
        record = ModelStore(get_paths()).pull(source, name)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"installed {record.name} ({record.format}, {record.size / 1e6:.1f} MB, {record.digest or 'package'})"
    )


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_models(as_json: bool) -> None:
    """List installed models."""
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
    """Remove an installed model (its weights are deleted once nothing else uses them)."""
    try:
        ModelStore(get_paths()).remove(name)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"removed {name}")
