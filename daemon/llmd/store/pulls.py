"""Pulls inside the daemon: resolve a name to hub files, check, download, convert, publish -
reporting progress events that any number of clients can follow.

Sources: a catalog name (``qwen3-4b``; a package-shipped entry is copied offline), a hub repo
``hf.co/ORG/REPO[:QUANT]`` (a GGUF repo with a quantization tag, default Q4_K_M, or a
safetensors/MLX repo), or an absolute local path. A hub model is installed under the name it
was pulled as (``hf.co/ORG/REPO:QUANT``), as Ollama does.

Order of a hub GGUF pull, each step failing with a message that says what to do:
repo metadata -> file metadata (LFS sha256, size) -> the file's GGUF header by a ranged GET
(architecture refused here, conversion planned, before any large download) -> free-disk check
(remaining download + conversion output) -> download (downloader.py: resumable, parallel,
verified) -> conversion if needed (convert.py) -> manifest. The store lock is held shared
throughout, so `llmd gc` cannot sweep a pull's files from under it.

Events (one JSON object per line on the wire; the shape of Ollama's /api/pull):
``{"status": "pulling manifest"}``,
``{"status": "pulling <digest12>", "digest": "sha256:...", "file", "total", "completed"}``,
``{"status": "verifying sha256 digest"}``, ``{"status": "converting", "detail", "total",
"completed"}``, ``{"status": "writing manifest"}``, then exactly one of
``{"status": "success", "model", ...}`` or ``{"error": {"message", "type", "param", "code"}}``.

Two requests for the same pull share one job (both see every event); a client that goes away
does not stop the pull. Daemon shutdown stops pulls after checkpointing their downloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from llmd.store.catalog import CatalogEntry, builtin_file, install_hint, load_catalog
from llmd.store.convert import ConversionPlan
from llmd.store.downloader import Downloader, DownloadOptions
from llmd.store.gguf_layout import GGUFFormatError, GGUFLayout, read_layout
from llmd.store.hub import (
    HubClient,
    HubError,
    HubNotFound,
    IntegrityError,
    RemoteFile,
    RepoInfo,
    choose_gguf,
    choose_mmproj,
    gguf_files,
    hub_endpoint,
    hub_token,
    parse_repo_ref,
)
from llmd.store.install import (
    check_engine_loads,
    check_gguf,
    check_hf_config,
    check_local_source,
    convert_to_blob,
    converted_blob_for,
    gguf_record,
    hf_kind,
    insufficient_storage,
    kind_not_for_gguf,
    tree_record,
)
from llmd.store.manifests import (
    InsufficientStorage,
    ModelRecord,
    StoreError,
    UnsupportedModel,
    validate_name,
)
from llmd.store.model_store import ModelStore
from llmd.store.model_support import architecture_supported, unsupported_architecture_message

log = logging.getLogger("llmd.pulls")

DISK_RESERVE = 256 << 20  # left free after a pull, for logs and the OS
_PROGRESS_INTERVAL = 0.1
_TREE_FILES = (".safetensors", ".json", ".jinja", ".model", ".txt", ".tiktoken")
# A sentence-transformers pooling config (model_kind.py reads it at pull time), the Dense
# modules' files (store/dense_modules.py applies them), and the model card (model_kind.py reads
# whether it was trained for Matryoshka truncation).
_POOLING_FILES = ("1_Pooling/config.json",)
_MODULE_FILES = re.compile(r"^\d+_Dense/(config\.json|model\.safetensors)$")
_MODEL_CARD = "README.md"
_SKIP_TREE = ("README", ".gitattributes", "LICENSE", "USE_POLICY", "NOTICE")


def _error_event(exc: StoreError | str, code: str = "pull_failed", status: int = 500) -> dict:
    if isinstance(exc, StoreError):
        message, code, status = str(exc), exc.code, exc.status
    else:
        message = exc
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": "model",
            "code": code,
        }
    }


class PullJob:
    """One running pull and its event history, replayed to clients that join late."""

    def __init__(self, key: str, source: str, name: str) -> None:
        self.key = key
        self.source = source
        self.name = name
        self.started = time.time()
        self.history: list[dict[str, Any]] = []
        self.last_progress: dict[str, Any] | None = None
        self.queues: set[asyncio.Queue[dict[str, Any]]] = set()
        self.final: dict[str, Any] | None = None
        self.status_code = 200
        self.task: asyncio.Task[None] | None = None
        self._last_emit = 0.0
        self.kind: str | None = None  # what the pull says the model is for (model_kind.py)

    def emit(self, event: dict[str, Any], *, progress: bool = False) -> None:
        if progress:
            now = time.monotonic()
            last = event.get("completed") == event.get("total")
            if not last and now - self._last_emit < _PROGRESS_INTERVAL:
                self.last_progress = event
                return
            self._last_emit = now
            self.last_progress = event
        else:
            if self.last_progress is not None:  # keep the order: final progress, then this
                self.history.append(self.last_progress)
                self.last_progress = None
            self.history.append(event)
        for q in list(self.queues):
            q.put_nowait(event)

    def finish(self, event: dict[str, Any], status: int = 200) -> None:
        if self.final is None:
            self.final = event
            self.status_code = status
            self.emit(event)

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """Every event so far, then live ones, ending with the success or error event."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for event in self.history:
            q.put_nowait(event)
        if self.last_progress is not None:
            q.put_nowait(self.last_progress)
        self.queues.add(q)
        try:
            while True:
                event = await q.get()
                yield event
                if event is self.final:
                    return
        finally:
            self.queues.discard(q)

    async def wait(self) -> dict[str, Any]:
        async for event in self.follow():
            if event is self.final:
                return event
        raise RuntimeError("unreachable")  # pragma: no cover

    def bytes_needed(self) -> int:
        """The size of what the pull was writing when it stopped (its last progress total)."""
        for event in [self.last_progress, *reversed(self.history)]:
            if event and isinstance(event.get("total"), int):
                return int(event["total"])
        return 0

    def describe(self) -> dict[str, Any]:
        latest = self.last_progress or (self.history[-1] if self.history else {})
        return {"model": self.name, "source": self.source, "started": self.started, **latest}


@dataclasses.dataclass
class _Target:
    """What a source names on the hub."""

    repo: str
    revision: str | None
    name: str  # install name
    file: str | None = None  # a catalog entry's GGUF file
    tag: str | None = None
    entry: CatalogEntry | None = None


def resolve_source(source: str, name: str | None = None) -> tuple[str, _Target | Path]:
    """(install name, what to fetch) for a pull of `source`, without the network; raises
    StoreError for what is wrong before any download (the CLI checks this first too)."""
    source = source.strip()
    if not source:
        raise StoreError("give a model to pull", code="invalid_value")
    entry = load_catalog().get(source)
    if entry is not None:
        package = builtin_file(entry)
        if package is not None:
            return validate_name(name or source), package
        if not architecture_supported(entry.family):
            raise UnsupportedModel(
                unsupported_architecture_message(entry.family, f"'{source}' ({entry.repo})")
                + " Nothing was downloaded."
            )
        target = _Target(entry.repo, None, source, file=entry.file, entry=entry)
        return validate_name(name or source), target
    ref = parse_repo_ref(source)
    if ref is not None:
        default = f"hf.co/{ref.repo}" + (f":{ref.tag}" if ref.tag else "")
        install = validate_name(name or default)
        return install, _Target(ref.repo, ref.revision, install, tag=ref.tag)
    path = Path(source).expanduser()
    if path.is_absolute() and path.exists():
        check_local_source(path)  # a FIFO, a device, /proc/self/mem: refused before any job
        default = path.stem if path.is_file() else path.name
        return validate_name(name or default), path
    raise StoreError(
        f"'{source}' is neither a catalog name, a hub repo (hf.co/ORG/REPO[:QUANT]) nor "
        f"an absolute local path. {install_hint(source)}",
        code="model_not_found",
        status=404,
    )


class PullManager:
    """The daemon's pulls: start or join one, list them, stop them all at shutdown."""

    def __init__(
        self,
        store: ModelStore,
        options: DownloadOptions | None = None,
        *,
        disk_reserve: int = DISK_RESERVE,
    ) -> None:
        self.store = store
        self.downloader = Downloader(store, options)
        self.disk_reserve = disk_reserve
        self.jobs: dict[str, PullJob] = {}
        self._session: aiohttp.ClientSession | None = None
        self._conversions: dict[str, asyncio.Future[str]] = {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=32), auto_decompress=False
            )
        return self._session

    def start(
        self,
        source: str,
        name: str | None = None,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        kind: str | None = None,
    ) -> PullJob:
        """The running pull of `source` (as `name`), started now if there is none. Errors
        knowable without the network (a bad name, an unknown source, an architecture the
        catalog already names) are raised here, before any stream starts."""
        install_name, target = resolve_source(source, name)
        key = f"{install_name}\0{source}"
        job = self.jobs.get(key)
        if job is not None and job.final is None:
            return job
        job = PullJob(key, source, install_name)
        job.kind = kind
        self.jobs[key] = job
        job.task = asyncio.create_task(self._run(job, target, endpoint, token))
        job.task.add_done_callback(lambda _t: self._forget(job))
        return job

    def _forget(self, job: PullJob) -> None:
        if self.jobs.get(job.key) is job:
            del self.jobs[job.key]

    async def close(self) -> None:
        """Daemon shutdown: stop conversions and downloads (checkpointed), end every job."""
        tasks = [j.task for j in self.jobs.values() if j.task is not None]
        tasks += list(self._conversions.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.downloader.cancel_all()
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ resolution

    # ------------------------------------------------------------------ the pull

    async def _run(
        self, job: PullJob, target: _Target | Path, endpoint: str | None, token: str | None
    ) -> None:
        try:
            if isinstance(target, Path):
                record = await self._import(job, target)
            else:
                # A token is only ever sent to the endpoint it belongs to: a request naming
                # another endpoint gets the request's token or none, never the daemon's own.
                own = endpoint is None or hub_endpoint(endpoint) == hub_endpoint()
                if not token and own:
                    token = await asyncio.to_thread(hub_token)  # imports huggingface_hub
                hub = HubClient(self.session(), endpoint, token)
                guard = await asyncio.to_thread(self.store.lock_shared)
                try:
                    record = await self._pull_hub(job, hub, target)
                finally:
                    guard.close()
            job.finish(
                {
                    "status": "success",
                    "model": record.name,
                    "digest": record.digest,
                    "format": record.format,
                    "quantization": record.quantization,
                    "size": record.size,
                    "note": record.note,
                }
            )
        except StoreError as exc:
            job.finish(_error_event(exc), exc.status)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                log.exception("pull of %s failed", job.source)
                job.finish(_error_event(f"the pull of {job.source} failed: {exc}"), 500)
                return
            full = insufficient_storage(job.bytes_needed(), self.store.paths.models)
            job.finish(_error_event(full), full.status)
        except asyncio.CancelledError:
            job.finish(
                _error_event(
                    f"llmd is shutting down: the pull of {job.name} stopped; its download is "
                    f"kept and `llmd pull {job.source}` resumes it",
                    code="shutting_down",
                    status=503,
                ),
                503,
            )
            raise
        except Exception as exc:  # noqa: BLE001 - the daemon outlives any one pull
            log.exception("pull of %s failed", job.source)
            job.finish(_error_event(f"the pull of {job.source} failed: {exc}"), 500)

    async def _import(self, job: PullJob, path: Path) -> ModelRecord:
        """A package-shipped catalog entry or an absolute local path, copied in a thread."""
        loop = asyncio.get_running_loop()
        job.emit({"status": f"importing {path}"})

        def progress(phase: str, done: int, total: int) -> None:
            loop.call_soon_threadsafe(
                lambda: job.emit(
                    {"status": phase, "file": path.name, "total": total, "completed": done},
                    progress=True,
                )
            )

        source = job.source if load_catalog().get(job.source) else str(path)
        return await asyncio.to_thread(self.store.pull, source, job.name, progress, job.kind)

    async def _pull_hub(self, job: PullJob, hub: HubClient, target: _Target) -> ModelRecord:
        job.emit({"status": "pulling manifest"})
        info = await hub.model_info(target.repo, target.revision)
        files = gguf_files(info)
        if target.file is not None or target.tag is not None or files:
            if job.kind is not None:
                raise kind_not_for_gguf()
            filename = target.file or choose_gguf(info, target.tag)
            if filename not in info.siblings:
                raise HubNotFound(
                    f"{target.repo} has no file {filename} (llmd's catalog may be out of date; "
                    f"its GGUF files: {', '.join(files) or 'none'}). Pull one of them with "
                    f"hf.co/{target.repo}:TAG"
                )
            return await self._pull_gguf(job, hub, target, info, filename)
        return await self._pull_tree(job, hub, target, info)

    async def _remote(self, hub: HubClient, info: RepoInfo, filename: str) -> RemoteFile:
        remote = await hub.file_meta(info.repo, info.sha, filename)
        listed = info.siblings.get(filename)
        if listed is not None and listed.sha256:
            if remote.sha256 and remote.sha256 != listed.sha256:
                raise IntegrityError(
                    f"the hub gives two different sha256 for {filename} (file metadata "
                    f"{remote.sha256}, repo listing {listed.sha256}); pull again later"
                )
            if remote.sha256 is None:
                remote = dataclasses.replace(remote, sha256=listed.sha256, git_sha1=None)
        return remote

    async def _pull_gguf(
        self, job: PullJob, hub: HubClient, target: _Target, info: RepoInfo, filename: str
    ) -> ModelRecord:
        remote = await self._remote(hub, info, filename)
        if remote.sha256 is None:
            raise HubError(
                f"{filename} in {info.repo} has no LFS sha256 on the hub, so llmd cannot verify "
                "it; refusing to install unverified weights"
            )
        sha = remote.sha256
        what = f"hf.co/{info.repo}/{filename}"
        mmproj = await self._mmproj_remote(hub, info, filename)
        source = f"hf:{info.repo}@{remote.revision}/{filename}"
        license = target.entry.license if target.entry else ""
        reuse = converted_blob_for(self.store, f"sha256:{sha}")
        if reuse is not None:  # converted before: no download, no conversion
            job.emit({"status": "writing manifest"})
            record = dataclasses.replace(
                reuse,
                name=target.name,
                source=source,
                modified=time.time(),
                mmproj=await self._pull_mmproj(job, hub, mmproj),
            )
            return self.store.write_manifest(record)
        layout: GGUFLayout
        if self.store.has_blob(sha):
            layout = await asyncio.to_thread(read_layout, self.store.blob_path(sha))
        else:
            layout = await self.downloader.probe_gguf(hub, remote)
        plan = check_gguf(layout, what)
        plan.source_size = remote.size
        self._check_disk(target.name, [remote, *([mmproj] if mmproj else [])], plan)
        await self._download(job, hub, remote)
        blob = self.store.blob_path(sha)
        try:
            layout = await asyncio.to_thread(read_layout, blob)
        except GGUFFormatError as exc:
            raise UnsupportedModel(f"{what} is not a valid GGUF file: {exc}") from exc
        note = ""
        final = sha
        if plan.needed:
            final = await self._shared_conversion(job, sha, blob, layout, plan)
            layout = await asyncio.to_thread(read_layout, self.store.blob_path(final))
            note = plan.note()
        job.emit({"status": "writing manifest"})
        record = gguf_record(
            self.store,
            target.name,
            final,
            layout,
            source,
            note=note,
            source_digest=f"sha256:{sha}",
            license=license,
        )
        record = dataclasses.replace(record, mmproj=await self._pull_mmproj(job, hub, mmproj))
        job.emit({"status": "checking that the engine loads it"})
        try:
            record = await asyncio.to_thread(check_engine_loads, self.store, record, what)
            return self.store.write_manifest(record)
        finally:  # installed or refused, the unconverted original is of no use unless shared
            if final != sha and not any(sha in r.blob_digests() for r in self.store.list()):
                blob.unlink(missing_ok=True)

    async def _mmproj_remote(
        self, hub: HubClient, info: RepoInfo, filename: str
    ) -> RemoteFile | None:
        """The repo's llama.cpp vision tower for `filename` (hub.choose_mmproj), if it ships
        one: fetched with the model so a multimodal GGUF sees images, as llama-server's `-hf`
        does. Refused like the model when the hub gives no sha256 to verify it by."""
        name = choose_mmproj(info, filename)
        if name is None:
            return None
        remote = await self._remote(hub, info, name)
        if remote.sha256 is None:
            raise HubError(
                f"{name} in {info.repo} has no LFS sha256 on the hub, so llmd cannot verify "
                "it; refusing to install unverified weights"
            )
        return remote

    async def _pull_mmproj(self, job: PullJob, hub: HubClient, remote: RemoteFile | None) -> str:
        """The mmproj's verified blob (the manifest's `mmproj`), or "" without one."""
        if remote is None:
            return ""
        job.emit({"status": f"pulling the vision tower {remote.filename}"})
        return str(self.store.blob_path(await self._download(job, hub, remote)))

    async def _pull_tree(
        self, job: PullJob, hub: HubClient, target: _Target, info: RepoInfo
    ) -> ModelRecord:
        names = sorted(
            n
            for n in info.siblings
            if n == _MODEL_CARD
            or _MODULE_FILES.match(n)
            or (
                ("/" not in n or n in _POOLING_FILES)
                and n.endswith(_TREE_FILES)
                and not n.startswith(_SKIP_TREE)
            )
        )
        top_weights = any("/" not in n and n.endswith(".safetensors") for n in names)
        if "config.json" not in names or not top_weights:
            raise HubNotFound(
                f"{info.repo} has neither GGUF files nor a config.json with *.safetensors "
                "weights: llmd cannot run anything from it"
            )
        config_remote = await self._remote(hub, info, "config.json")
        config_sha = await self.downloader.fetch(hub, config_remote, lambda _d, _t: None)
        try:
            config = json.loads(self.store.blob_path(config_sha).read_text())
        except ValueError as exc:
            raise HubError(f"{info.repo}/config.json is not valid JSON: {exc}") from exc
        arch = check_hf_config(config, f"hf.co/{info.repo}")
        remotes = [await self._remote(hub, info, n) for n in names]
        self._check_disk(target.name, remotes, ConversionPlan())
        files: list[tuple[str, str]] = []
        entries = []
        for remote in remotes:
            sha = await self._download(job, hub, remote)
            files.append((remote.filename, sha))
            entries.append(
                {"name": remote.filename, "digest": f"sha256:{sha}", "size": remote.size}
            )
        job.emit({"status": "writing manifest"})
        tree = await asyncio.to_thread(self.store.make_tree, files)
        source = f"hf:{info.repo}@{info.sha}"
        license = target.entry.license if target.entry else ""
        kind = hf_kind(tree, info.repo, f"hf.co/{info.repo}", arch, job.kind)
        return self.store.write_manifest(
            tree_record(self.store, target.name, tree, entries, source, arch, license, kind)
        )

    def _check_disk(self, name: str, remotes: list[RemoteFile], plan: ConversionPlan) -> None:
        download = 0
        for r in remotes:
            if r.sha256 is None:
                download += r.size
            elif not self.store.has_blob(r.sha256):
                download += r.size - self.downloader.partial_bytes(r.sha256)
        convert = plan.output_size if plan.needed else 0
        need = download + convert
        self.store.paths.blobs.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.store.paths.blobs).free
        if need + self.disk_reserve > free:
            parts = f"{_gb(download)} to download" + (
                f" + {_gb(convert)} for the conversion" if convert else ""
            )
            raise InsufficientStorage(
                f"not enough free disk space to pull {name}: it needs {_gb(need)} ({parts}) "
                f"plus {_gb(self.disk_reserve)} to spare, and {self.store.paths.models} has "
                f"{_gb(free)} free. Free some space (`llmd gc` deletes unused blobs and old "
                "partial downloads, `llmd rm NAME` removes a model) and pull again."
            )

    async def _download(self, job: PullJob, hub: HubClient, remote: RemoteFile) -> str:
        label = (remote.sha256 or remote.git_sha1 or "")[:12]
        verifying = False

        def listener(completed: int, total: int) -> None:
            nonlocal verifying
            job.emit(
                {
                    "status": f"pulling {label}",
                    "digest": f"sha256:{remote.sha256}" if remote.sha256 else "",
                    "file": remote.filename,
                    "total": total,
                    "completed": completed,
                },
                progress=True,
            )
            if completed >= total and not verifying and remote.sha256:
                verifying = True
                job.emit({"status": "verifying sha256 digest", "file": remote.filename})

        return await self.downloader.fetch(hub, remote, listener)

    async def _shared_conversion(
        self, job: PullJob, sha: str, blob: Path, layout: GGUFLayout, plan: ConversionPlan
    ) -> str:
        """One conversion per source file, however many pulls need it at once."""
        running = self._conversions.get(sha)
        if running is None:
            running = asyncio.ensure_future(self._convert(job, blob, layout, plan))
            self._conversions[sha] = running
            running.add_done_callback(lambda _f: self._conversions.pop(sha, None))
        else:
            job.emit({"status": "converting", "detail": plan.summary(), "note": plan.note()})
        return await asyncio.shield(running)

    async def _convert(
        self, job: PullJob, blob: Path, layout: GGUFLayout, plan: ConversionPlan
    ) -> str:
        loop = asyncio.get_running_loop()
        detail = plan.summary()
        job.emit({"status": "converting", "detail": detail, "note": plan.note()})

        def progress(done: int, total: int) -> None:
            loop.call_soon_threadsafe(
                lambda: job.emit(
                    {"status": "converting", "detail": detail, "total": total, "completed": done},
                    progress=True,
                )
            )

        stop = threading.Event()
        worker = asyncio.ensure_future(
            asyncio.to_thread(convert_to_blob, self.store, blob, layout, plan, progress, stop)
        )
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            stop.set()  # the thread notices between chunks and removes its partial output
            with contextlib.suppress(BaseException):
                await worker
            raise


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
