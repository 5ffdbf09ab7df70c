"""`llmd serve`: the daemon in the foreground, with every option it takes. Its own module so
that `llmd service` (service.py) can parse the options it will pass to `llmd serve` without
importing the rest of the command line."""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from llmd.api.instance import AlreadyRunning
from llmd.api.security import SecurityConfig
from llmd.limits import (
    DEFAULT_KV_TYPE,
    DEFAULT_MAX_LOADED,
    DEFAULT_QUEUE_LIMIT,
    KV_TYPES,
    default_kv_disk,
    parse_size,
)
from llmd.paths import DEFAULT_HOST, DEFAULT_PORT, get_paths
from llmd.runtime.keep_alive import parse_keep_alive
from llmd.runtime.sessions import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL
from llmd.runtime.speculative import server_default
from llmd.store.model_store import ModelStore
from llmd.store.vocabulary import vocabulary_mismatch


def _size_option(value: str, name: str) -> int | None:
    """'auto' -> None; '2GiB', '512MB', '1048576' -> bytes."""
    if value == "auto":
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from exc


def _kv_disk_option(value: str) -> int:
    """--kv-disk: 'auto' -> the default bound, '0' -> off, else a size."""
    if value == "auto":
        return default_kv_disk(get_paths().kv_disk)
    if value.strip() == "0":
        return 0
    size = _size_option(value, "--kv-disk")
    return size or 0


def serve_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The daemon's settings, shared by `serve` (foreground) and `start` (detached)."""
    options = [
        click.option(
            "--host",
            default=DEFAULT_HOST,
            show_default=True,
            help="Address to listen on (loopback by default).",
        ),
        click.option("--port", default=DEFAULT_PORT, show_default=True, type=int, help="TCP port."),
        click.option(
            "--context-length",
            type=click.IntRange(min=1),
            default=None,
            help="Context (tokens) every model is served with; default: each model's trained "
            "context. Beyond it is allowed (as llama-server's -c, Ollama's num_ctx): positions "
            "past the trained context work, but their quality is not guaranteed (a warning is "
            "logged and shown in `llmd status`).",
        ),
        click.option(
            "--default-max-tokens",
            type=click.IntRange(min=1),
            default=None,
            help="Output limit of a chat request that names none (Codex never does); default: "
            "the rest of the context, as OpenAI does.",
        ),
        click.option(
            "--threads", type=int, default=None, help="CPU threads per worker (default: all cores)."
        ),
        click.option(
            "--max-body",
            type=int,
            default=16 * 1024 * 1024,
            show_default=True,
            help="Largest request body in bytes (413 beyond).",
        ),
        click.option(
            "--max-sequences",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Requests per model decoded together in one batch; more wait in its queue.",
        ),
        click.option(
            "--queue-limit",
            type=click.IntRange(min=0),
            default=DEFAULT_QUEUE_LIMIT,
            show_default=True,
            help="Requests that may wait per model beyond its running ones; more get HTTP 429.",
        ),
        click.option(
            "--kv-budget",
            default="auto",
            show_default=True,
            help="KV cache memory per model (e.g. 2GiB, 512MiB); auto: a quarter of free memory.",
        ),
        click.option(
            "--kv-type",
            type=click.Choice(KV_TYPES),
            default=DEFAULT_KV_TYPE,
            show_default=True,
            help="KV cache element type: f16, or GGML's q8_0 / q4_0 blocks (about 1.9x / 3.6x "
            "the context in the same --kv-budget, at some quality cost). "
            "A model's own setting (`llmd set NAME --kv-type`) wins.",
        ),
        click.option(
            "--kv-disk",
            default="auto",
            show_default=True,
            help="Disk tier of the KV cache, in the llmd cache dir: prompt KV blocks are written "
            "there, so a repeated prefix (an agent's system prompt) loads from disk after "
            "eviction, an unload, a worker crash or a restart instead of being prefilled again. "
            "A bound shared by all models (e.g. 20GiB), least recently used files go first; "
            "0: off; auto: 20GiB or a tenth of the free disk, whichever is less.",
        ),
        click.option(
            "--session-ttl",
            type=click.FloatRange(min=0, min_open=True),
            default=DEFAULT_SESSION_TTL,
            show_default=True,
            help="Seconds a named session's KV stays pinned after its last request.",
        ),
        click.option(
            "--max-sessions",
            type=click.IntRange(min=0),
            default=DEFAULT_MAX_SESSIONS,
            show_default=True,
            help="Named sessions that may pin KV at once; a new one beyond unpins the least "
            "recently used idle one.",
        ),
        click.option(
            "--keep-alive",
            default="5m",
            show_default=True,
            help="How long a model stays loaded after its last request (5m, 1h, 0, -1 = forever); "
            "requests may override it with keep_alive.",
        ),
        click.option(
            "--max-loaded",
            type=click.IntRange(min=1),
            default=DEFAULT_MAX_LOADED,
            show_default=True,
            help="Models loaded at once; loading one more unloads the least recently used.",
        ),
        click.option(
            "--memory-budget",
            default="auto",
            show_default=True,
            help="Memory for loaded models (weights + KV budgets), e.g. 12GiB; auto: 80%% of RAM. "
            "Loading beyond it unloads least recently used models.",
        ),
        click.option(
            "--preload",
            multiple=True,
            metavar="NAME",
            help="Load and warm up NAME at start and keep it loaded (repeatable).",
        ),
        click.option(
            "--drain-timeout",
            type=click.FloatRange(min=0),
            default=30.0,
            show_default=True,
            help="On stop, seconds running requests may take to finish before they are ended.",
        ),
        click.option(
            "--log-file",
            type=click.Path(dir_okay=False),
            default=None,
            help="Log here, rotated at 10 MiB (5 kept), instead of to stderr.",
        ),
        click.option(
            "--allow-host",
            multiple=True,
            metavar="NAME",
            help="Also accept requests whose Host is NAME (repeatable; * for any, behind a "
            "proxy you trust). Loopback names always work.",
        ),
        click.option(
            "--cors-origin",
            multiple=True,
            metavar="ORIGIN",
            help="Let web pages from ORIGIN (e.g. http://localhost:3000) call the API "
            "(repeatable; * for any). Other origins are refused.",
        ),
        click.option(
            "--api-key",
            envvar="LLMD_API_KEY",
            default=None,
            help="Require `Authorization: Bearer KEY` (or x-api-key) over TCP "
            "[env LLMD_API_KEY]. The Unix socket never needs it.",
        ),
        click.option(
            "--speculative",
            type=click.Choice(["off", "ngram", "draft_model", "mtp"]),
            default=None,
            help="Speculative decoding every request gets unless it says otherwise (its "
            "`speculative` field): ngram drafts from the request's own prompt and output, "
            "draft_model with --draft-model, mtp with the model's own MTP head (Qwen3.5; models "
            "without one run without); the drafts of every running sequence are verified "
            "in one batched step. Output is the same with or without; edits of given text run "
            "several times faster. Default: draft_model with --draft-model, else off.",
        ),
        click.option(
            "--draft-model",
            default=None,
            metavar="NAME",
            help="An installed model loaded beside each model (in its worker) to draft tokens "
            "for speculative decoding; it must have the model's vocabulary (a model of another "
            "vocabulary loads without it, and says so in /status). `llmd set NAME "
            "--draft-model D` sets one per model.",
        ),
        click.option(
            "--speculative-max-draft",
            type=click.IntRange(min=1, max=32),
            default=None,
            help="Most tokens drafted per sequence and step (default 8; each sequence adapts "
            "below it to how many of its drafts were accepted).",
        ),
        click.option(
            "--allow-remote-images",
            is_flag=True,
            default=False,
            help="Fetch images that requests give as http(s) URLs (within 20 MiB and 15 s). "
            "Off by default: requests send images inline (base64), and the daemon fetches "
            "nothing on a client's behalf.",
        ),
        click.option("-v", "--verbose", is_flag=True, help="Log worker output and debug details."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _allowed_hosts(host: str, extra: tuple[str, ...], api_key: str | None) -> tuple[str, ...]:
    """Warn loudly when listening beyond loopback. A specific IP address listened on is
    allowed as a Host (a bare IP cannot be DNS-rebound); names must be allowed explicitly."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return extra
    click.secho(
        f"WARNING: listening on {host}: anyone who can reach it can use your models"
        + ("" if api_key else " (set --api-key)")
        + ". Clients must address it by IP or by a name given with --allow-host.",
        fg="red",
        err=True,
    )
    logging.getLogger("llmd").warning("listening on non-loopback address %s", host)
    if host not in ("0.0.0.0", "::"):
        return (*extra, host)
    return extra


def _check_draft_model(draft_model: str, preload: tuple[str, ...]) -> None:
    """A startup error for a --draft-model that is not installed, or whose vocabulary differs
    from a --preload model's (other models find out at load, and say so in /status)."""
    store = ModelStore(get_paths())
    draft = store.resolve(draft_model)
    if draft is None:
        raise click.ClickException(f"--draft-model: '{draft_model}' is not installed (llmd pull)")
    for name in preload:
        record = store.resolve(name)
        problem = record and vocabulary_mismatch(record.path, draft.path)
        if problem:
            raise click.ClickException(
                f"--draft-model: '{draft_model}' cannot draft for '{name}': {problem}"
            )


def _setup_logging(log_file: str | None, verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if log_file is None:
        logging.basicConfig(level=level, format=fmt)
        return
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        log_file, maxBytes=10 * 2**20, backupCount=5, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])


@click.command()
@serve_options
def serve(
    host: str,
    port: int,
    context_length: int | None,
    default_max_tokens: int | None,
    threads: int | None,
    max_body: int,
    max_sequences: int,
    queue_limit: int,
    kv_budget: str,
    kv_type: str,
    kv_disk: str,
    session_ttl: float,
    max_sessions: int,
    keep_alive: str,
    max_loaded: int,
    memory_budget: str,
    preload: tuple[str, ...],
    drain_timeout: float,
    log_file: str | None,
    allow_host: tuple[str, ...],
    cors_origin: tuple[str, ...],
    api_key: str | None,
    speculative: str | None,
    draft_model: str | None,
    speculative_max_draft: int | None,
    allow_remote_images: bool,
    verbose: bool,
) -> None:
    """Run the daemon in the foreground (TCP and a Unix socket); `llmd start` detaches it.

    \b
    Serves OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus
    /health and /status, on http://HOST:PORT and on a Unix socket (mode 0600) in
    llmd's runtime dir; the socket path is printed at start. Models load on their
    first request (or with --preload), each in its own supervised worker process,
    and unload after --keep-alive idle. Stop with Ctrl-C, SIGTERM or `llmd stop`:
    running requests get --drain-timeout seconds to finish.
    """
    from llmd.api.server import serve as run_server

    if speculative is None:
        speculative = "draft_model" if draft_model else "off"
    if speculative == "draft_model" and not draft_model:
        raise click.UsageError("--speculative draft_model needs --draft-model NAME")
    if draft_model:
        _check_draft_model(draft_model, preload)

    try:
        keep_alive_s = parse_keep_alive(keep_alive)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--keep-alive") from exc
    _setup_logging(log_file, verbose)
    allowed = _allowed_hosts(host, allow_host, api_key)
    try:
        security = SecurityConfig(
            allowed_hosts=allowed, cors_origins=cors_origin, api_key=api_key or None
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        asyncio.run(
            run_server(
                get_paths(),
                host,
                port,
                drain_timeout=drain_timeout,
                max_body=max_body,
                context_length=context_length,
                default_max_tokens=default_max_tokens,
                threads=threads,
                max_sequences=max_sequences,
                queue_limit=queue_limit,
                kv_budget_bytes=_size_option(kv_budget, "--kv-budget"),
                kv_type=kv_type,
                kv_disk_bytes=_kv_disk_option(kv_disk),
                session_ttl=session_ttl,
                max_sessions=max_sessions,
                keep_alive=keep_alive_s,
                max_loaded=max_loaded,
                memory_budget=_size_option(memory_budget, "--memory-budget"),
                preload=preload,
                security=security,
                speculative_max_draft=server_default(speculative, speculative_max_draft),
                allow_remote_images=allow_remote_images,
                speculative_drafter="ngram" if speculative == "off" else speculative,
                draft_model=draft_model,
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
