"""TEST DOUBLE of the Hugging Face Hub: an aiohttp server speaking the hub's HTTP conventions
(as huggingface_hub 0.2x-1.x reads them) over real files, with faults tests can inject.

Conventions emulated:
- ``GET /api/models/{org}/{repo}`` and ``/api/models/{org}/{repo}/revision/{rev}``:
  ``{"id", "sha", "gated", "siblings": [{"rfilename", "size"?, "lfs"?: {"sha256", "size",
  "pointerSize"}}]}`` (sizes and LFS data only with ``?blobs=true``, as the hub does).
- ``HEAD|GET /{org}/{repo}/resolve/{rev}/{file}``: LFS files answer ``302`` to a CDN URL on a
  *different host* (a second port) with ``X-Repo-Commit``, ``ETag`` and ``X-Linked-Etag`` (the
  sha256, quoted) and ``X-Linked-Size``; small git files answer ``200`` with the git blob sha1
  as ``ETag`` and the body.
- The CDN (``/cdn/{sha256}``) honours ``Range: bytes=a-b`` with ``206`` + ``Content-Range``
  and never needs (nor should receive) the token.
- Errors: ``401`` (no token) / ``403`` (wrong token) with ``X-Error-Code: GatedRepo`` for gated
  repos; ``404`` with ``X-Error-Code: RepoNotFound`` / ``EntryNotFound`` / ``RevisionNotFound``.

Faults: ``drop_after[file] = n`` drops the connection once after n bytes of that file;
``corrupt[file] = offset`` flips one byte there in every response; ``chunk_delay`` slows the
CDN down (so concurrent pulls overlap). ``log`` records every request, ``served[file]`` the
bytes sent, so tests can prove a resume fetched only the rest and a shared pull fetched once.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

TOKEN = "hf_fake_test_token"
_CHUNK = 256 * 1024


@dataclass
class FakeFile:
    name: str
    source: Path | bytes
    lfs: bool
    size: int
    sha256: str
    git_sha1: str

    def read(self, start: int, length: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start : start + length]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(length)


@dataclass
class FakeRepo:
    repo_id: str
    commit: str
    files: dict[str, FakeFile] = field(default_factory=dict)
    gated: bool = False


_HASHES: dict[tuple[str, int, float], tuple[str, str]] = {}


def _hashes(source: Path | bytes) -> tuple[str, str]:
    """(sha256, git sha1) of a file, cached per path+size+mtime across tests."""
    if isinstance(source, bytes):
        git = hashlib.sha1(b"blob %d\0" % len(source) + source).hexdigest()
        return hashlib.sha256(source).hexdigest(), git
    st = source.stat()
    key = (str(source), st.st_size, st.st_mtime)
    if key not in _HASHES:
        sha, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % st.st_size)
        with open(source, "rb") as f:
            while chunk := f.read(1 << 20):
                sha.update(chunk)
                git.update(chunk)
        _HASHES[key] = (sha.hexdigest(), git.hexdigest())
    return _HASHES[key]


class FakeHub:
    """The test double (see the module docstring). `await start()` in a test's loop, or
    `start_in_thread()` for a hub that a separate `llmd serve` process reaches."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.log: list[dict[str, Any]] = []
        self.served: Counter[str] = Counter()
        self.drop_after: dict[str, int] = {}
        self.corrupt: dict[str, int] = {}
        self.chunk_delay = 0.0
        self.endpoint = ""
        self.cdn = ""
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ setup

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, Path | bytes],
        *,
        gated: bool = False,
        lfs_min: int = 1024,
    ) -> FakeRepo:
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        repo = FakeRepo(repo_id, commit, gated=gated)
        for name, source in files.items():
            size = len(source) if isinstance(source, bytes) else source.stat().st_size
            sha, git = _hashes(source)
            lfs = size >= lfs_min or name.endswith((".gguf", ".safetensors"))
            repo.files[name] = FakeFile(name, source, lfs, size, sha, git)
        self.repos[repo_id] = repo
        return repo

    def requests(self, kind: str | None = None, file: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.log
            if (kind is None or r["kind"] == kind) and (file is None or r.get("file") == file)
        ]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{repo}", self._model_info)
        app.router.add_get("/api/models/{org}/{repo}/revision/{rev}", self._model_info)
        app.router.add_get("/{org}/{repo}/resolve/{rev}/{file:.+}", self._resolve)  # + HEAD
        app.router.add_get("/cdn/{sha}", self._cdn)
        return app

    async def start(self) -> str:
        """Listen on two loopback ports (hub, CDN); returns the endpoint URL."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        hub = web.TCPSite(self._runner, "127.0.0.1", 0)
        cdn = web.TCPSite(self._runner, "127.0.0.1", 0)
        await hub.start()
        await cdn.start()
        ports = [s._server.sockets[0].getsockname()[1] for s in (hub, cdn)]  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{ports[0]}"
        self.cdn = f"http://127.0.0.1:{ports[1]}"
        return self.endpoint

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def start_in_thread(self) -> str:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start())
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.stop())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-hub", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self.endpoint

    def stop_thread(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    # ------------------------------------------------------------------ routes

    def _record(self, request: web.Request, kind: str, **extra: Any) -> None:
        self.log.append(
            {
                "kind": kind,
                "method": request.method,
                "path": request.path,
                "range": request.headers.get("Range"),
                "auth": request.headers.get("Authorization"),
                **extra,
            }
        )

    def _repo(self, request: web.Request) -> FakeRepo:
        repo_id = f"{request.match_info['org']}/{request.match_info['repo']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            raise web.HTTPNotFound(
                headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
            )
        rev = request.match_info.get("rev")
        if rev is not None and rev not in ("main", repo.commit):
            raise web.HTTPNotFound(headers={"X-Error-Code": "RevisionNotFound"})
        return repo

    async def _model_info(self, request: web.Request) -> web.Response:
        self._record(request, "api")
        repo = self._repo(request)
        blobs = request.query.get("blobs") in ("true", "True", "1")
        siblings = []
        for f in repo.files.values():
            entry: dict[str, Any] = {"rfilename": f.name}
            if blobs:
                entry["size"] = f.size
                entry["blobId"] = f.git_sha1
                if f.lfs:
                    entry["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(entry)
        return web.json_response(
            {
                "id": repo.repo_id,
                "sha": repo.commit,
                "gated": "manual" if repo.gated else False,
                "private": False,
                "siblings": siblings,
            }
        )

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        self._record(request, "resolve", file=name)
        repo = self._repo(request)
        if repo.gated:
            auth = request.headers.get("Authorization")
            if auth is None:
                raise web.HTTPUnauthorized(headers={"X-Error-Code": "GatedRepo"})
            if auth != f"Bearer {TOKEN}":
                raise web.HTTPForbidden(headers={"X-Error-Code": "GatedRepo"})
        f = repo.files.get(name)
        if f is None:
            raise web.HTTPNotFound(
                headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}
            )
        headers = {"X-Repo-Commit": repo.commit}
        if f.lfs:
            headers.update(
                {
                    "ETag": f'"{f.sha256}"',
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(f.size),
                    "Location": f"{self.cdn}/cdn/{f.sha256}?file={name}",
                }
            )
            return web.Response(status=302, headers=headers)
        headers["ETag"] = f'"{f.git_sha1}"'
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(f.size)})
        return await self._send(request, f, headers)

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        sha = request.match_info["sha"]
        for repo in self.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha:
                    self._record(request, "cdn", file=f.name)
                    return await self._send(request, f, {})
        raise web.HTTPNotFound()

    async def _send(
        self, request: web.Request, f: FakeFile, headers: dict[str, str]
    ) -> web.StreamResponse:
        start, end = 0, f.size - 1
        status = 200
        rng = request.headers.get("Range")
        if rng:
            a, _, b = rng.removeprefix("bytes=").partition("-")
            start = int(a)
            end = min(int(b), f.size - 1) if b else f.size - 1
            if start >= f.size:
                raise web.HTTPRequestRangeNotSatisfiable()
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{f.size}"}
        length = end - start + 1
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = length
        resp.content_type = "application/octet-stream"
        await resp.prepare(request)
        drop = self.drop_after.get(f.name)
        pos = start
        while pos <= end:
            n = min(_CHUNK, end + 1 - pos)
            if drop is not None and pos + n > drop >= pos:
                n = drop - pos
                if n:
                    await resp.write(self._bytes(f, pos, n))
                    self.served[f.name] += n
                del self.drop_after[f.name]  # once
                request.transport.close()  # type: ignore[union-attr]
                return resp
            await resp.write(self._bytes(f, pos, n))
            self.served[f.name] += n
            pos += n
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        await resp.write_eof()
        return resp

    def _bytes(self, f: FakeFile, start: int, n: int) -> bytes:
        data = f.read(start, n)
        flip = self.corrupt.get(f.name)
        if flip is not None and start <= flip < start + n:
            i = flip - start
            data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
        return data
