"""The digest that keys a model's KV blocks on disk (the disk tier, native/core/kv_disk.h).

The daemon passes the store's own digest (`ModelRecord.digest`, checked at pull time); a worker
started by hand on a file gets the same value computed here: the sha256 of the GGUF file, or
of a Hugging Face directory's (name, sha256) list as the store computes it. Blocks computed
from other weights must never match, so the digest covers every byte of the model."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def with_vision_tower(digest: str, mmproj: str) -> str:
    """The digest of a GGUF model served with an mmproj: an image's KV rows come from the
    tower's embeddings (their ids only from the pixels), so another mmproj beside the same
    model (another precision) must key other blocks. A store blob is named by its sha256
    (checked at pull): read from the name, not hashed again."""
    path = Path(mmproj)
    name = path.name.removeprefix("sha256-")
    stored = path.parent.name == "blobs" and len(name) == 64 and name != path.name
    tower = f"sha256:{name}" if stored else model_digest(mmproj)
    return "sha256:" + hashlib.sha256(f"{digest} {tower}".encode()).hexdigest()


def model_digest(model: str) -> str:
    """``sha256:<hex>`` of a model file, or of a directory's sorted (name, sha256) lines."""
    path = Path(model)
    if path.is_file():
        return f"sha256:{_file_sha256(path)}"
    listing = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        listing.update(f"{f.relative_to(path).as_posix()} {_file_sha256(f)}\n".encode())
    return f"sha256:{listing.hexdigest()}"
