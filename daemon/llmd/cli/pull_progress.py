"""The client side of `llmd pull`: follow a daemon pull's NDJSON events and draw them as
progress bars (bytes, rate, ETA), or run a local import in this process.

Decision: hub pulls always run in a daemon - the running one, else a temporary one started
for the command, as `llmd run` does (cli._daemon). One code path downloads, verifies and
publishes whoever asks (CLI, API, another tool); the daemon's single-instance lock means one
process writes the store's partial files; and Ctrl-C here only stops *following*: a running
daemon finishes the pull (a later `llmd pull` shows it or finds it done), a temporary one
stops with the command after checkpointing, and the next pull resumes. Local files and the
package-shipped default model need no network and are imported in this process.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import aiohttp
import click
from tqdm import tqdm

from llmd.paths import get_paths
from llmd.store.catalog import builtin_file, load_catalog
from llmd.store.hub import parse_repo_ref
from llmd.store.manifests import ModelRecord, StoreError
from llmd.store.model_store import ModelStore


def needs_daemon(source: str) -> bool:
    """Whether `source` is downloaded (by the daemon): a hub repo, or a catalog entry no
    installed package ships. Everything else - local files, the package's model, and names
    that are none of these (for their error) - is handled in this process."""
    entry = load_catalog().get(source)
    if entry is not None:
        return builtin_file(entry) is None
    try:
        return parse_repo_ref(source) is not None
    except StoreError:
        return True  # a malformed hf.co/... reference: `precheck` says what is wrong


def request_body(source: str, name: str | None, kind: str | None = None) -> dict[str, Any]:
    """The pull request, carrying this shell's HF_ENDPOINT/HF_TOKEN when set (a daemon
    started earlier, e.g. as a service, does not see them)."""
    body: dict[str, Any] = {"model": source}
    if name:
        body["name"] = name
    if kind:
        body["kind"] = kind
    if os.environ.get("HF_ENDPOINT"):
        body["endpoint"] = os.environ["HF_ENDPOINT"]
    if os.environ.get("HF_TOKEN"):
        body["token"] = os.environ["HF_TOKEN"]
    return body


class Bars:
    """One tqdm bar per file (download) or phase (conversion, copy), on stderr."""

    def __init__(self) -> None:
        self.bars: dict[str, tqdm] = {}

    def update(self, key: str, label: str, completed: int, total: int) -> None:
        bar = self.bars.get(key)
        if bar is None:
            bar = tqdm(
                total=total,
                initial=completed,
                desc=label,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.2,
                leave=True,
            )
            self.bars[key] = bar
            return
        if total and bar.total != total:
            bar.total = total
        if completed > bar.n:
            bar.update(completed - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


def show_event(event: dict[str, Any], bars: Bars) -> None:
    status = str(event.get("status", ""))
    if "total" in event and "completed" in event and event.get("total"):
        bars.update(
            f"{status}\0{event.get('file', '')}", status, event["completed"], event["total"]
        )
        return
    bars.close()
    line = status
    if event.get("file") and status.startswith("verifying"):
        line += f" ({event['file']})"
    if event.get("detail"):
        line += f" {event['detail']}"
    click.echo(line, err=True)


def precheck(source: str, name: str | None) -> None:
    """What is knowable without the network (a catalog model the engine cannot run, a bad
    name) is said before a daemon is started for nothing."""
    from llmd.store.pulls import resolve_source

    try:
        resolve_source(source, name)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc


async def follow_pull(sock: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST the pull to the daemon and draw its events; the success event, or
    ClickException with the daemon's message."""
    bars = Bars()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
            async with s.post(
                "http://llmd/v1/models/pull",
                json=body,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            ) as r:
                if r.status != 200:
                    try:
                        err = (await r.json()).get("error", {})
                    except (aiohttp.ContentTypeError, ValueError):
                        err = {}
                    if r.status in (404, 405) and not err.get("code"):
                        raise click.ClickException(
                            "the running llmd daemon cannot pull models (it predates "
                            "/v1/models/pull): restart it with `llmd stop` and `llmd start`"
                        )
                    raise click.ClickException(err.get("message") or f"HTTP {r.status}")
                async for raw in r.content:
                    if not raw.strip():
                        continue
                    event = json.loads(raw)
                    if "error" in event:
                        bars.close()
                        raise click.ClickException(event["error"].get("message", "pull failed"))
                    if event.get("status") == "success":
                        bars.close()
                        return event
                    show_event(event, bars)
    finally:
        bars.close()
    raise click.ClickException("the daemon ended the pull without a result (was it stopped?)")


def print_installed(name: str, fmt: str, quant: str, size: int, digest: str, note: str) -> None:
    quant_text = f", {quant}" if quant else ""
    click.echo(f"installed {name} ({fmt}{quant_text}, {size / 1e6:.1f} MB, {digest or 'package'})")
    if note:
        click.echo(f"note: {note}")


def pull_local(source: str, name: str | None, kind: str | None = None) -> ModelRecord:
    bars = Bars()

    def progress(phase: str, done: int, total: int) -> None:
        bars.update(phase, phase, done, total)

    try:
        return ModelStore(get_paths()).pull(source, name, progress, kind)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        bars.close()
