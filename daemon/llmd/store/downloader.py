"""llmd's download engine: one hub file into one verified blob, resumable and in parallel.

- **Resumable.** Bytes go to ``blobs/sha256-<hex>.partial`` (pre-sized; segments are written
  in place) and the completed byte count of each segment to ``.partial.json``, checkpointed
  every second after an fsync of the data, so the state never claims bytes the disk lacks. A
  dropped connection is resumed with an HTTP ``Range`` request at once (a few retries with
  backoff); a pull that failed, was stopped, or died with the daemon continues from the
  checkpoint next time.
- **Parallel.** Files over `parallel_threshold` are fetched as up to `connections` ranged
  segments at once (a single CDN connection is often capped well below the link).
- **Verified.** sha256 is computed while the bytes arrive (in file order: the first segment
  streams through the hash, later ones are read back once the data before them is complete)
  and compared with the hub's LFS sha256 before the file is renamed to its blob name. A
  mismatch deletes the partial: nothing unverified is ever published.
- **Shared.** Two pulls that need the same blob (the same model pulled twice at once, or two
  names for one file) share one download and both see its progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from llmd.store.gguf_layout import GGUFLayout, Truncated, parse_layout
from llmd.store.hub import HubClient, HubError, HubUnreachable, IntegrityError, RemoteFile
from llmd.store.model_store import ModelStore

log = logging.getLogger("llmd.download")

_READ_CHUNK = 1 << 20
_DOWNLOAD_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=20, sock_read=60)
Listener = Callable[[int, int], None]  # (completed bytes, total bytes)


@dataclass
class DownloadOptions:
    connections: int = 4
    parallel_threshold: int = 64 << 20  # bytes; smaller files use one connection
    min_segment: int = 16 << 20
    retries: int = 4  # per segment: failed attempts in a row without progress
    backoff: float = 0.5
    checkpoint_interval: float = 1.0
    probe_max: int = 64 << 20  # most bytes fetched to read a GGUF header before downloading


@dataclass
class _Segment:
    start: int
    end: int  # exclusive
    done: int = 0

    @property
    def remaining(self) -> int:
        return self.end - self.start - self.done


class _OrderedHasher:
    """sha256 over a file written out of order: chunks that land at the hashed position are
    hashed as they arrive; the rest is read back from disk once everything before it is
    there (`catch_up`)."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.pos = 0
        self.busy = False
        self._lock = asyncio.Lock()

    def feed(self, offset: int, data: bytes) -> None:
        if not self.busy and offset == self.pos:
            self.sha.update(data)
            self.pos += len(data)

    async def catch_up(self, path: Path, available: Callable[[], int]) -> None:
        async with self._lock:
            while True:
                target = available()
                if self.pos >= target:
                    return
                self.busy = True
                try:
                    await asyncio.to_thread(self._read, path, self.pos, target)
                finally:
                    self.busy = False

    def _read(self, path: Path, start: int, end: int) -> None:
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(_READ_CHUNK, left))
                if not chunk:
                    raise IntegrityError(f"{path} is shorter than the bytes written to it")
                self.sha.update(chunk)
                left -= len(chunk)
        self.pos = end


class _Download:
    """One blob's download; listeners can join while it runs."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.completed = 0
        self.listeners: list[Listener] = []
        self.task: asyncio.Task[str] | None = None

    def progress(self, n: int) -> None:
        self.completed += n
        for listener in list(self.listeners):
            listener(self.completed, self.total)


class Downloader:
    """Downloads hub files into `store` (see the module docstring)."""

    def __init__(self, store: ModelStore, options: DownloadOptions | None = None) -> None:
        self.store = store
        self.options = options or DownloadOptions()
        self._active: dict[str, _Download] = {}
        self.bytes_received = 0  # from the network, all downloads (GET /metrics)

    # ------------------------------------------------------------------ public

    def partial_bytes(self, sha256: str) -> int:
        """Bytes of `sha256` already on disk from an interrupted download."""
        state = self._load_state(sha256, None)
        return sum(s.done for s in state) if state else 0

    async def fetch(self, hub: HubClient, remote: RemoteFile, listener: Listener) -> str:
        """The hex digest of `remote`, downloaded and verified into a blob (or already
        there). An LFS file must match its hub sha256; a small git file its git sha1."""
        if remote.sha256 is None:
            return await self._fetch_small(hub, remote, listener)
        sha = remote.sha256
        if self.store.has_blob(sha):
            with contextlib.suppress(OSError):
                os.utime(self.store.blob_path(sha))  # freshly referenced: not an old orphan
            listener(remote.size, remote.size)
            return sha
        job = self._active.get(sha)
        if job is None:
            job = _Download(remote.size)
            self._active[sha] = job
            job.task = asyncio.create_task(self._run(hub, remote, job))
            job.task.add_done_callback(lambda _t: self._active.pop(sha, None))
        job.listeners.append(listener)
        listener(job.completed, job.total)
        try:
            return await asyncio.shield(job.task)
        finally:
            with contextlib.suppress(ValueError):
                job.listeners.remove(listener)

    async def cancel_all(self) -> None:
        """Daemon shutdown: stop every download; each checkpoints its progress first."""
        tasks = [j.task for j in self._active.values() if j.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def probe_gguf(self, hub: HubClient, remote: RemoteFile) -> GGUFLayout:
        """The GGUF layout from the file's first bytes (ranged GETs, growing until the
        header fits), so an unsupported model is refused before the download."""
        want = 1 << 20
        while True:
            want = min(want, remote.size, self.options.probe_max)
            data = await self._get_range(hub, remote, 0, want)
            try:
                return parse_layout(data)
            except Truncated as exc:
                if want >= min(remote.size, self.options.probe_max):
                    raise HubError(
                        f"{remote.filename}: its GGUF header is larger than "
                        f"{self.options.probe_max >> 20} MiB or the file is truncated"
                    ) from exc
                want = max(want * 4, exc.needed + 4096)

    # ------------------------------------------------------------------ internals

    def _paths(self, sha: str) -> tuple[Path, Path]:
        partial = self.store.paths.blobs / f"sha256-{sha}.partial"
        return partial, partial.with_name(partial.name + ".json")

    def _plan(self, size: int) -> list[_Segment]:
        if size == 0:
            return []
        o = self.options
        n = 1
        if size >= o.parallel_threshold:
            n = max(1, min(o.connections, size // max(o.min_segment, 1)))
        step = -(-size // n)
        return [_Segment(i, min(i + step, size)) for i in range(0, size, step)]

    def _load_state(self, sha: str, size: int | None) -> list[_Segment] | None:
        partial, state_file = self._paths(sha)
        try:
            state = json.loads(state_file.read_text())
            segments = [_Segment(*s) for s in state["segments"]]
            if size is not None and state["size"] != size:
                return None
            if partial.stat().st_size != state["size"]:
                return None
            if any(s.done < 0 or s.done > s.end - s.start for s in segments):
                return None
            return segments
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save_state(self, sha: str, size: int, segments: list[_Segment], fd: int) -> None:
        snapshot = [[s.start, s.end, s.done] for s in segments]  # before the fsync below
        os.fsync(fd)  # the data first: the state never claims bytes the disk lacks
        _, state_file = self._paths(sha)
        tmp = state_file.with_name(state_file.name + ".tmp")
        tmp.write_text(json.dumps({"size": size, "segments": snapshot}))
        os.replace(tmp, state_file)

    async def _run(self, hub: HubClient, remote: RemoteFile, job: _Download) -> str:
        sha = remote.sha256
        assert sha is not None
        size = remote.size
        partial, state_file = self._paths(sha)
        self.store.paths.blobs.mkdir(parents=True, exist_ok=True)
        segments = self._load_state(sha, size)
        if segments is None:
            segments = self._plan(size)
            with open(partial, "wb") as f:
                f.truncate(size)
            self._save_state_plain(sha, size, segments)
        else:
            log.info(
                "resuming %s at %d of %d bytes",
                remote.filename,
                sum(s.done for s in segments),
                size,
            )
        job.progress(sum(s.done for s in segments))
        hasher = _OrderedHasher()

        def contiguous() -> int:
            end = 0
            for s in sorted(segments, key=lambda s: s.start):
                if s.start != end:
                    break
                end = s.start + s.done
                if s.remaining:
                    break
            return end

        fd = os.open(partial, os.O_RDWR)
        stopped = asyncio.Event()
        checkpointer = asyncio.create_task(self._checkpoints(sha, size, segments, fd, stopped))
        ok = False
        corrupt: IntegrityError | None = None
        try:
            await hasher.catch_up(partial, contiguous)  # bytes from an earlier attempt
            workers = [
                asyncio.create_task(
                    self._segment(hub, remote, s, fd, hasher, job, partial, contiguous)
                )
                for s in segments
                if s.remaining
            ]
            try:
                await asyncio.gather(*workers)
            except BaseException:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                raise
            await hasher.catch_up(partial, lambda: size)
            digest = hasher.sha.hexdigest()
            if digest != sha:
                corrupt = IntegrityError(
                    f"{remote.filename} from {remote.repo} failed verification: its sha256 is "
                    f"{digest}, the hub's LFS metadata says {sha}. The download was deleted and "
                    "nothing was installed; pull again (a proxy or disk may be corrupting data)."
                )
            else:
                os.fsync(fd)
                ok = True
        finally:
            stopped.set()
            await asyncio.gather(checkpointer, return_exceptions=True)
            if corrupt is not None:
                partial.unlink(missing_ok=True)
                state_file.unlink(missing_ok=True)
            elif not ok and partial.exists():
                with contextlib.suppress(OSError):
                    self._save_state(sha, size, segments, fd)
            os.close(fd)
        if corrupt is not None:
            raise corrupt
        self.store.publish_blob(partial, sha)
        state_file.unlink(missing_ok=True)
        return sha

    def _save_state_plain(self, sha: str, size: int, segments: list[_Segment]) -> None:
        fd = os.open(self._paths(sha)[0], os.O_RDWR)
        try:
            self._save_state(sha, size, segments, fd)
        finally:
            os.close(fd)

    async def _checkpoints(
        self, sha: str, size: int, segments: list[_Segment], fd: int, stopped: asyncio.Event
    ) -> None:
        while not stopped.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), self.options.checkpoint_interval)
            if not stopped.is_set():
                await asyncio.to_thread(self._save_state, sha, size, segments, fd)

    async def _segment(
        self,
        hub: HubClient,
        remote: RemoteFile,
        seg: _Segment,
        fd: int,
        hasher: _OrderedHasher,
        job: _Download,
        partial: Path,
        contiguous: Callable[[], int],
    ) -> None:
        failures = 0
        while seg.remaining:
            start = seg.start + seg.done
            before = seg.done
            try:
                await self._stream(hub, remote, seg, start, fd, hasher, job)
                if seg.remaining:
                    raise aiohttp.ClientPayloadError("the connection ended before the range did")
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
                failures = 1 if seg.done > before else failures + 1  # a streak
                if failures > self.options.retries:
                    raise HubUnreachable(
                        f"downloading {remote.filename} failed after {failures} attempts "
                        f"({exc.__class__.__name__}: {exc}); {self._progress_text(job)} are "
                        f"kept: `llmd pull` again resumes from there"
                    ) from exc
                log.warning(
                    "%s: connection lost at byte %d (%s); resuming",
                    remote.filename,
                    start + (seg.done - before),
                    exc,
                )
                await asyncio.sleep(self.options.backoff * (2 ** max(failures - 1, 0)))
        await hasher.catch_up(partial, contiguous)

    @staticmethod
    def _progress_text(job: _Download) -> str:
        return f"{job.completed / 1e6:.1f} of {job.total / 1e6:.1f} MB"

    async def _stream(
        self,
        hub: HubClient,
        remote: RemoteFile,
        seg: _Segment,
        start: int,
        fd: int,
        hasher: _OrderedHasher,
        job: _Download,
    ) -> None:
        headers = self._headers(hub, remote)
        headers["Range"] = f"bytes={start}-{seg.end - 1}"
        async with hub.session.get(remote.url, headers=headers, timeout=_DOWNLOAD_TIMEOUT) as r:
            if r.status == 200 and start == 0 and seg.end == remote.size:
                pass  # a server without Range support, fetching the whole file: fine
            elif r.status != 206:
                await self._refuse(hub, remote, r)
            else:
                content_range = r.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise HubError(
                        f"{remote.filename}: asked for bytes {start}-, got '{content_range}'"
                    )
            async for chunk in r.content.iter_chunked(_READ_CHUNK):
                room = seg.end - (seg.start + seg.done)
                if room <= 0:
                    break
                data = chunk[:room]
                offset = seg.start + seg.done
                os.pwrite(fd, data, offset)
                hasher.feed(offset, data)
                seg.done += len(data)
                self.bytes_received += len(data)
                job.progress(len(data))

    def _headers(self, hub: HubClient, remote: RemoteFile) -> dict[str, str]:
        headers = hub.headers_for(remote.url) if remote.send_token else {"User-Agent": "llmd"}
        headers["Accept-Encoding"] = "identity"
        return headers

    async def _refuse(self, hub: HubClient, remote: RemoteFile, r: aiohttp.ClientResponse) -> None:
        if r.status >= 500 or r.status == 429:
            raise aiohttp.ClientResponseError(
                r.request_info, (), status=r.status, message=f"HTTP {r.status} from the CDN"
            )
        await hub.raise_for(r, remote.repo, filename=remote.filename, revision=remote.revision)
        raise HubError(f"{remote.filename}: unexpected HTTP {r.status} to a ranged request")

    async def _get_range(self, hub: HubClient, remote: RemoteFile, start: int, end: int) -> bytes:
        headers = self._headers(hub, remote)
        headers["Range"] = f"bytes={start}-{end - 1}"
        try:
            async with hub.session.get(remote.url, headers=headers, timeout=_DOWNLOAD_TIMEOUT) as r:
                if r.status not in (200, 206):
                    await self._refuse(hub, remote, r)
                data = bytearray()
                async for chunk in r.content.iter_chunked(_READ_CHUNK):
                    data += chunk
                    self.bytes_received += len(chunk)
                    if len(data) >= end - start:
                        break
                return bytes(data[: end - start])
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            raise hub.unreachable(exc) from exc

    async def _fetch_small(self, hub: HubClient, remote: RemoteFile, listener: Listener) -> str:
        """A small git file (config.json, tokenizer_config.json): fetched whole, checked
        against its git blob sha1 (the hub's ETag), stored as a blob."""
        headers = self._headers(hub, remote)
        try:
            async with hub.session.get(remote.url, headers=headers, timeout=_DOWNLOAD_TIMEOUT) as r:
                if r.status != 200:
                    await self._refuse(hub, remote, r)
                data = await r.read()
                self.bytes_received += len(data)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            raise hub.unreachable(exc) from exc
        if remote.git_sha1:
            git = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
            if git != remote.git_sha1:
                raise IntegrityError(
                    f"{remote.filename} from {remote.repo} failed verification (git sha1 "
                    f"{git}, the hub says {remote.git_sha1}); nothing was installed"
                )
        sha = hashlib.sha256(data).hexdigest()
        if not self.store.has_blob(sha):
            tmp = self.store.temp_path("small")
            try:
                tmp.write_bytes(data)
                self.store.publish_blob(tmp, sha)
            finally:
                tmp.unlink(missing_ok=True)
        listener(len(data), len(data))
        return sha
