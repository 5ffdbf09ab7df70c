"""Read the key/value metadata of a GGUF file, and nothing else.

The daemon needs a model's tokenizer, chat template and context length, never its tensors.
``gguf.GGUFReader`` maps and indexes every tensor and turns each vocabulary string into a
numpy array (~2.7 s for the 135M test model); this reader stops after the metadata section
and decodes strings directly (~0.1 s), so the first request to a model is not held up by it.

Format (GGUF v2/v3, little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64
metadata count, then per entry: u64-length UTF-8 key, u32 value type, value. Arrays are a
u32 element type, a u64 count and the elements.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

_MAGIC = b"GGUF"

# value type -> struct format of a scalar
_SCALARS: dict[int, str] = {
    0: "<B",  # uint8
    1: "<b",  # int8
    2: "<H",  # uint16
    3: "<h",  # int16
    4: "<I",  # uint32
    5: "<i",  # int32
    6: "<f",  # float32
    7: "<?",  # bool
    10: "<Q",  # uint64
    11: "<q",  # int64
    12: "<d",  # float64
}
_STRING = 8
_ARRAY = 9


class GGUFMetadataError(ValueError):
    """The file is not a GGUF file this reader understands (the message says why)."""


class _Cursor:
    """Sequential reads from a buffered file; metadata is a few MB at most."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def take(self, n: int) -> bytes:
        data = self._stream.read(n)
        if len(data) != n:
            raise GGUFMetadataError("the file ends inside its metadata section (truncated?)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return self.take(n).decode("utf-8", errors="replace")


# Arrays of arrays nest this deep at most (real files: one level).
MAX_ARRAY_DEPTH = 8


def _value(cur: _Cursor, vtype: int, depth: int = 0) -> Any:
    if depth > MAX_ARRAY_DEPTH:
        raise GGUFMetadataError(f"metadata arrays nest deeper than {MAX_ARRAY_DEPTH} levels")
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype])
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        etype = cur.unpack("<I")
        count = cur.unpack("<Q")
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            size = struct.calcsize(fmt)
            data = cur.take(size * count)
            return list(struct.unpack(f"<{count}{fmt[1]}", data))
        if etype == _STRING:
            return [cur.string() for _ in range(count)]
        if etype == _ARRAY:
            return [_value(cur, _ARRAY, depth + 1) for _ in range(count)]
        raise GGUFMetadataError(f"unknown GGUF array element type {etype}")
    raise GGUFMetadataError(f"unknown GGUF value type {vtype}")


def read_gguf_metadata(path: Path | str) -> dict[str, Any]:
    """All metadata key/values of the GGUF file at ``path`` (plus ``GGUF.version``)."""
    with open(path, "rb", buffering=1 << 20) as f:
        cur = _Cursor(f)
        if cur.take(4) != _MAGIC:
            raise GGUFMetadataError(f"{path} is not a GGUF file (bad magic)")
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise GGUFMetadataError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        cur.unpack("<Q")  # tensor count: the daemon does not look at tensors
        n_kv = cur.unpack("<Q")
        out: dict[str, Any] = {"GGUF.version": version}
        for _ in range(n_kv):
            key = cur.string()
            out[key] = _value(cur, cur.unpack("<I"))
        return out
