"""`llmd remote add/list/rm`: remote models (remotes.py), managed in the store directly as
`llmd list`/`rm` manage local ones, so no daemon needs to run; a running daemon reads the
change at its next request. `add` asks the upstream first (it must answer and serve the
model), with the key from this shell's environment; the daemon later reads the same variable
from its own environment."""

from __future__ import annotations

import asyncio
import json

import click

from llmd.paths import get_paths
from llmd.store.model_store import ModelStore
from llmd.store.remotes import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_QUEUE_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    RemoteError,
    RemoteStore,
    probe_new,
)


@click.group()
def remote() -> None:
    """Remote models: names llmd serves by forwarding to an OpenAI-compatible server that
    runs elsewhere (vLLM, SGLang, another llmd, llama-server).

    \b
      llmd remote add big --url http://gpu-box:8000 --model meta-llama/Llama-3.3-70B-Instruct
      llmd remote list
      llmd remote rm big

    Clients then ask llmd for `big` in any protocol llmd speaks (OpenAI chat/completions
    and Responses, Anthropic Messages, Ollama's /api/chat and /api/generate).
    """


@remote.command()
@click.argument("name")
@click.option("--url", required=True, help="The upstream's base URL (http or https; /v1 optional).")
@click.option(
    "--model",
    "upstream_model",
    default=None,
    help="The upstream's model id (default: NAME if it serves that, else its only model).",
)
@click.option(
    "--api-key-env",
    default=None,
    metavar="VAR",
    help="Environment variable holding the upstream's API key, sent as Bearer. Only the "
    "name is stored; the daemon must have VAR set.",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1, max=4096),
    default=DEFAULT_MAX_CONCURRENCY,
    show_default=True,
    help="Requests in flight to this upstream at once; more wait (see --queue-timeout).",
)
@click.option(
    "--queue-timeout",
    type=click.FloatRange(min=0, max=3600),
    default=DEFAULT_QUEUE_TIMEOUT,
    show_default=True,
    help="Seconds a request waits for a free slot before it gets HTTP 429.",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0, min_open=True, max=600),
    default=DEFAULT_CONNECT_TIMEOUT,
    show_default=True,
    help="Seconds to connect to the upstream (502 beyond).",
)
@click.option(
    "--read-timeout",
    type=click.FloatRange(min=0, min_open=True, max=86400),
    default=DEFAULT_READ_TIMEOUT,
    show_default=True,
    help="Seconds the upstream may stay silent while answering (504 beyond).",
)
@click.option(
    "--ca-bundle",
    type=click.Path(exists=True, dir_okay=False, resolve_path=True),
    default=None,
    help="PEM file of CA certificates to verify an https upstream against (a cluster's own "
    "CA) instead of the system's. Its path is stored; the file is read at each connection.",
)
def add(
    name: str,
    url: str,
    upstream_model: str | None,
    api_key_env: str | None,
    max_concurrency: int,
    queue_timeout: float,
    connect_timeout: float,
    read_timeout: float,
    ca_bundle: str | None,
) -> None:
    """Serve NAME from the OpenAI-compatible server at --url (checked now: it must answer
    and list the model; its context length is recorded)."""
    paths = get_paths()
    local = ModelStore(paths)
    fields = {
        "name": name,
        "url": url,
        "upstream_model": upstream_model,
        "api_key_env": api_key_env,
        "max_concurrency": max_concurrency,
        "queue_timeout": queue_timeout,
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
        "ca_bundle": ca_bundle,
    }
    try:
        remotes = RemoteStore(paths)
        remotes.check_free(name, local)
        record = asyncio.run(probe_new(fields))
        remotes.add(record, local)
    except RemoteError as exc:
        raise click.ClickException(exc.message) from exc
    context = f", context {record.context_length}" if record.context_length else ""
    click.echo(f"added {record.name} -> {record.upstream_model} at {record.url}{context}")


@remote.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_remotes(as_json: bool) -> None:
    """List remote models: name, upstream URL and model, context, concurrency, key variable."""
    records = RemoteStore(get_paths()).list()
    if as_json:
        click.echo(json.dumps([r.model_dump() for r in records], indent=2))
        return
    if not records:
        click.echo("no remote models (add one with `llmd remote add NAME --url URL`)")
        return
    local = ModelStore(get_paths())
    click.echo(f"{'NAME':24} {'URL':32} {'UPSTREAM MODEL':32} {'CONTEXT':>8} {'MAX':>4}  KEY")
    for r in records:
        shadow = "  (shadowed by a local model)" if local.resolve(r.name) is not None else ""
        click.echo(
            f"{r.name:24} {r.url:32} {r.upstream_model:32} {r.context_length or '-':>8} "
            f"{r.max_concurrency:>4}  {('$' + r.api_key_env) if r.api_key_env else '-'}{shadow}"
        )


@remote.command()
@click.argument("name")
def rm(name: str) -> None:
    """Stop serving the remote model NAME (nothing on the upstream changes)."""
    try:
        RemoteStore(get_paths()).remove(name)
    except RemoteError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(f"removed remote {name}")
