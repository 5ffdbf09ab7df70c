"""The KV disk tier's key for a GGUF model served with an mmproj covers the mmproj: an image's
KV rows come from the tower's embeddings, so another tower must never reuse them."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmd.worker.model_digest import model_digest, with_vision_tower


def test_another_mmproj_keys_other_blocks(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF model")
    f16, q8 = tmp_path / "mmproj-F16.gguf", tmp_path / "mmproj-Q8_0.gguf"
    f16.write_bytes(b"GGUF f16 tower")
    q8.write_bytes(b"GGUF q8 tower")
    digest = model_digest(str(model))
    keys = {digest, with_vision_tower(digest, str(f16)), with_vision_tower(digest, str(q8))}
    assert len(keys) == 3
    assert with_vision_tower(digest, str(f16)) == with_vision_tower(digest, str(f16))


def test_a_store_blob_is_keyed_by_its_name(tmp_path: Path) -> None:
    """Same key whether the tower is a store blob (named by its sha256) or a loose file."""
    loose = tmp_path / "mmproj.gguf"
    loose.write_bytes(b"GGUF tower")
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    blob = blobs / f"sha256-{hashlib.sha256(b'GGUF tower').hexdigest()}"
    blob.write_bytes(b"GGUF tower")
    assert with_vision_tower("sha256:00", str(blob)) == with_vision_tower("sha256:00", str(loose))
