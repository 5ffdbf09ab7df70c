"""Remote models: names llmd serves by handing requests to an OpenAI-compatible engine that
already runs elsewhere (vLLM, SGLang, another llmd, llama-server), instead of loading weights.

One JSON record per remote under ``<data>/models/remotes/<name>.json``, beside the local
manifests, written atomically (temporary file, then rename) as the manifests are. A record
holds the upstream's base URL, the upstream's own model id, limits and timeouts, and the
context length the upstream reported when the remote was added. It never holds an API key:
only the *name* of the environment variable the daemon reads the key from at request time,
so a key on disk, in a backup or in `llmd remote list` cannot leak.

The upstream URL comes from the record only: a request body names a model, never a URL, so no
client can make the daemon reach anything but the configured remotes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from yarl import URL

from llmd.paths import Paths
from llmd.store.manifests import StoreError, could_be_installed, validate_name
from llmd.store.model_store import ModelStore

DEFAULT_MAX_CONCURRENCY = 16
DEFAULT_QUEUE_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 10.0
# Between two reads from the upstream: a non-streamed answer from a big model arrives in one
# piece after the whole generation, so this is minutes, not seconds.
DEFAULT_READ_TIMEOUT = 300.0
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class RemoteError(Exception):
    """Adding, probing or removing a remote failed; `status`/`code` are what HTTP answers."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_remote") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


def normalize_url(raw: str) -> str:
    """The upstream's base URL (``/v1/...`` is appended per request). http/https only, a host,
    no credentials (they would land on disk: use --api-key-env), no query or fragment. A
    trailing ``/v1`` is dropped, since users copy the URL their OpenAI client uses."""
    try:
        url = URL(raw.strip())
    except (ValueError, TypeError) as exc:
        raise RemoteError(f"invalid URL {raw!r}: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise RemoteError(f"invalid URL {raw!r}: use http://HOST[:PORT] or https://HOST[:PORT]")
    if url.user is not None or url.password is not None:
        raise RemoteError(
            "the URL must not carry credentials (they would be stored on disk); put the key "
            "in an environment variable and pass --api-key-env NAME"
        )
    if url.query_string or url.fragment:
        raise RemoteError(f"invalid URL {raw!r}: no query string or fragment")
    path = url.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return str(url.with_path(path or "/")).rstrip("/")


class RemoteRecord(BaseModel):
    """One remote model as stored (and as `GET /v1/remotes` shows it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    url: str
    upstream_model: str = Field(min_length=1)
    api_key_env: str | None = None
    max_concurrency: int = Field(default=DEFAULT_MAX_CONCURRENCY, ge=1, le=4096)
    queue_timeout: float = Field(default=DEFAULT_QUEUE_TIMEOUT, ge=0, le=3600)
    connect_timeout: float = Field(default=DEFAULT_CONNECT_TIMEOUT, gt=0, le=600)
    read_timeout: float = Field(default=DEFAULT_READ_TIMEOUT, gt=0, le=86400)
    context_length: int | None = None
    # What the upstream says the model can do, in llmd's words (`capabilities_of`); None when
    # its `/v1/models` does not say (vLLM, SGLang and llama-server do not).
    capabilities: dict[str, bool] | None = None
    # A PEM file of CA certificates the upstream's TLS certificate is verified against,
    # instead of the system's (a cluster's own CA). Never "no verification".
    ca_bundle: str | None = None
    added: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return validate_name(v)
        except StoreError as exc:
            raise ValueError(str(exc)) from exc

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        try:
            return normalize_url(v)
        except RemoteError as exc:
            raise ValueError(exc.message) from exc

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError(f"{v!r} is not an environment variable name")
        return v

    @field_validator("ca_bundle")
    @classmethod
    def _ca(cls, v: str | None) -> str | None:
        if v is None:
            return v
        path = Path(v).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        return str(path)

    @property
    def host(self) -> str:
        """host[:port] of the upstream: what listings show as the model's owner."""
        url = URL(self.url)
        return f"{url.host}:{url.port}" if url.explicit_port else str(url.host)

    def endpoint(self, path: str) -> str:
        """The upstream URL for one of our API paths (``/v1/chat/completions``)."""
        return self.url + path

    def key(self) -> str | None:
        """The API key, read from the environment now (never stored)."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env) or None

    def headers(self) -> dict[str, str]:
        """What llmd sends the upstream besides the body: nothing of the client's request
        (its own llmd key must not travel on), only the remote's key when configured."""
        headers = {"Accept": "application/json, text/event-stream"}
        if self.api_key_env is not None:
            key = self.key()
            if key is None:
                raise RemoteError(
                    f"remote '{self.name}' needs its API key in the environment variable "
                    f"{self.api_key_env}, which is not set for llmd",
                    status=500,
                    code="remote_key_missing",
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def scrub(self, text: str) -> str:
        """`text` (an upstream error) with the key blanked out: upstreams echo bad keys."""
        key = self.key()
        return text.replace(key, "***") if key else text


_SSL_CACHE: dict[tuple[str, float], ssl.SSLContext] = {}


def ssl_context(record: RemoteRecord) -> ssl.SSLContext | bool:
    """How the upstream's certificate is verified: against the remote's CA bundle when it has
    one (read again when the file changes), else the system's CAs (True, aiohttp's default).
    A bundle that is gone or unreadable is a RemoteError, never a fall back to no checks."""
    if record.ca_bundle is None:
        return True
    try:
        key = (record.ca_bundle, os.stat(record.ca_bundle).st_mtime)
        context = _SSL_CACHE.get(key)
        if context is None:
            context = ssl.create_default_context(cafile=record.ca_bundle)
            _SSL_CACHE.clear()  # one bundle per remote in practice: keep the cache small
            _SSL_CACHE[key] = context
        return context
    except (OSError, ssl.SSLError) as exc:
        raise RemoteError(
            f"remote '{record.name}': cannot use the CA bundle {record.ca_bundle}: {exc}",
            status=500,
            code="remote_ca_bundle",
        ) from exc


def parse_record(body: Any) -> RemoteRecord:
    """A record from a request body or a file; RemoteError naming the bad field."""
    if not isinstance(body, dict):
        raise RemoteError("a remote must be a JSON object")
    try:
        return RemoteRecord.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise RemoteError(f"invalid remote: {problems}") from exc


def _file_name(name: str) -> str:
    return name.replace("/", "--").replace(":", "--") + ".json"


class RemoteStore:
    """Remote records under one llmd home. Read from disk on every lookup, as the local
    manifests are, so `llmd remote add/rm` takes effect in a running daemon at once."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    @property
    def root(self) -> Path:
        return self.paths.models / "remotes"

    def list(self) -> list[RemoteRecord]:
        out = []
        if self.root.is_dir():
            for f in sorted(self.root.glob("*.json")):
                record = self._read(f)
                if record is not None:
                    out.append(record)
        return out

    def get(self, name: str) -> RemoteRecord | None:
        if not could_be_installed(name) or not self.root.is_dir():
            return None
        record = self._read(self.root / _file_name(name))
        return record if record is not None and record.name == name else None

    def _read(self, f: Path) -> RemoteRecord | None:
        try:
            return RemoteRecord.model_validate(json.loads(f.read_text()))
        except (OSError, ValueError):  # ValidationError is a ValueError
            return None  # gone meanwhile, foreign or damaged: not a remote

    def add(self, record: RemoteRecord, local: ModelStore) -> RemoteRecord:
        """Publish `record` atomically. A name a local model already serves is refused (409):
        a remote never silently takes a local model's requests; so is an existing remote's
        name (remove it first: changing where a name's requests go is explicit)."""
        self.check_free(record.name, local)
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.root / _file_name(record.name)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record.model_dump(), indent=2))
        os.replace(tmp, target)
        return record

    def check_free(self, name: str, local: ModelStore) -> None:
        """409 unless `name` is free: checked before the upstream is asked, and again when
        the record is written."""
        if local.resolve(name) is not None:
            raise RemoteError(
                f"'{name}' is already a local model; pick another name for the remote",
                status=409,
                code="name_taken",
            )
        if self.get(name) is not None:
            raise RemoteError(
                f"a remote called '{name}' exists; `llmd remote rm {name}` first",
                status=409,
                code="name_taken",
            )

    def remove(self, name: str) -> RemoteRecord:
        record = self.get(name)
        if record is None:
            raise RemoteError(f"no remote called '{name[:128]}'", status=404, code="not_found")
        (self.root / _file_name(name)).unlink(missing_ok=True)
        return record


# ---------------------------------------------------------------------- probing the upstream


def context_of(entry: dict[str, Any]) -> int | None:
    """The context length an upstream's `/v1/models` entry reports: vLLM, SGLang and llmd
    say `max_model_len`; llama-server puts `n_ctx` (served) or `n_ctx_train` in `meta`."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for value in (
        entry.get("max_model_len"),
        entry.get("context_length"),
        meta.get("n_ctx"),
        meta.get("n_ctx_train"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


# Capability names as Ollama and LM Studio list them -> llmd's (`/v1/models` of llmd says
# `capabilities: {"completion": true, ...}`; Ollama's `/api/show` a list of names).
_CAPABILITY_NAMES = {
    "completion": "completion",
    "chat": "chat",
    "tools": "tools",
    "tool_use": "tools",
    "thinking": "reasoning",
    "reasoning": "reasoning",
    "vision": "vision",
    "embedding": "embeddings",
    "embeddings": "embeddings",
    "rerank": "rerank",
}


def capabilities_of(entry: dict[str, Any]) -> dict[str, bool] | None:
    """The capabilities an upstream's `/v1/models` entry reports, in llmd's words: another
    llmd's `{"tools": true, ...}`, or a list of names (Ollama-style); None when it reports
    none. Unknown names are dropped: a client must not be told of a capability llmd cannot
    name."""
    raw = entry.get("capabilities")
    if isinstance(raw, dict):
        pairs = [(k, v) for k, v in raw.items() if isinstance(v, bool)]
    elif isinstance(raw, list):
        pairs = [(k, True) for k in raw if isinstance(k, str)]
    else:
        return None
    known = {_CAPABILITY_NAMES[k]: v for k, v in pairs if k in _CAPABILITY_NAMES}
    return known or None


async def probe(record: RemoteRecord) -> RemoteRecord:
    """Ask the upstream's `/v1/models` whether it serves the model, its context length and
    capabilities:
    a remote is only added once it answers. The upstream id defaults to the remote's name,
    else to the one model the upstream lists. Returns the record completed."""
    timeout = aiohttp.ClientTimeout(
        total=record.connect_timeout + 30, sock_connect=record.connect_timeout
    )
    where = record.endpoint("/v1/models")
    tls = ssl_context(record)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(where, headers=record.headers(), ssl=tls) as resp:
                text = await resp.text(errors="replace")
                if resp.status >= 400:
                    raise RemoteError(
                        f"the upstream at {record.url} answered {resp.status} to GET /v1/models: "
                        f"{record.scrub(text[:300])}",
                        status=502 if resp.status >= 500 else 400,
                        code="upstream_error",
                    )
    except asyncio.TimeoutError as exc:
        raise RemoteError(
            f"the upstream at {record.url} did not answer in time", status=504, code="timeout"
        ) from exc
    except aiohttp.ClientError as exc:
        raise RemoteError(
            f"cannot reach the upstream at {record.url}: {record.scrub(str(exc))}",
            status=502,
            code="upstream_unreachable",
        ) from exc
    try:
        listed = [e for e in json.loads(text).get("data", []) if isinstance(e, dict)]
    except (ValueError, AttributeError) as exc:
        raise RemoteError(
            f"the upstream at {record.url} is not an OpenAI-compatible server "
            "(GET /v1/models did not return a model list)",
            status=502,
            code="upstream_error",
        ) from exc
    ids = [str(e.get("id")) for e in listed]
    wanted = record.upstream_model
    if wanted not in ids:
        raise RemoteError(
            f"the upstream at {record.url} does not serve '{wanted}'; it lists: "
            f"{', '.join(ids[:20]) or 'no models'} (pick one with --model)",
            code="model_not_found",
        )
    entry = listed[ids.index(wanted)]
    return record.model_copy(
        update={"context_length": context_of(entry), "capabilities": capabilities_of(entry)}
    )


async def probe_new(fields: dict[str, Any]) -> RemoteRecord:
    """A record from user input (`llmd remote add`, `POST /v1/remotes`), probed. Without a
    model, the remote's name is tried, then the upstream's only model."""
    if not fields.get("upstream_model"):
        name = fields.get("name")
        first = parse_record({**fields, "upstream_model": name or "-"})
        try:
            return await probe(first)
        except RemoteError as exc:
            if exc.code != "model_not_found":
                raise
            only = await _only_model(first)
            if only is None:
                raise RemoteError(
                    f"{exc.message.split(' (pick')[0]}; name the upstream's model with --model",
                    code="model_not_found",
                ) from exc
            return await probe(first.model_copy(update={"upstream_model": only}))
    return await probe(parse_record(fields))


async def _only_model(record: RemoteRecord) -> str | None:
    timeout = aiohttp.ClientTimeout(total=record.connect_timeout + 30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(
            record.endpoint("/v1/models"), headers=record.headers(), ssl=ssl_context(record)
        ) as resp:
            data = await resp.json(content_type=None)
    ids = [e.get("id") for e in data.get("data", []) if isinstance(e, dict)]
    return str(ids[0]) if len(ids) == 1 else None
