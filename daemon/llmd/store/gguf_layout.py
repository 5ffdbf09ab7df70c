"""The layout of a GGUF file: typed metadata entries with their byte spans, tensor infos and
where the tensor data starts - from a whole file or from just the first bytes of one.

Pulls need this twice: before a download, from a ranged GET of the file's head, to refuse an
architecture the engine cannot run and to plan (and size) a conversion without fetching
gigabytes; and during a conversion, to copy every metadata entry byte for byte and to find
each tensor. ``gguf.GGUFReader`` builds numpy views of every vocabulary string (7.6 s for the
135M test model on this 2-core box) and needs the whole file; this parser reads the same
structures in ~0.1 s and says how many bytes it still needs when given a prefix.

Format (GGUF v2/v3, little-endian): ``GGUF``, u32 version, u64 tensor count, u64 KV count;
KVs (u64-length key, u32 type, value); tensor infos (name, u32 n_dims, u64 dims[n_dims],
u32 type, u64 offset); padding to ``general.alignment`` (32); tensor data.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from llmd.store.model_support import RETIRED_GGUF_TYPES, type_name

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9
_UINT32 = 4


class GGUFFormatError(ValueError):
    """Not a GGUF file this parser understands (the message says why)."""


class Truncated(Exception):
    """The buffer ends before the layout does; `needed` is a lower bound of the bytes to get."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"need at least {needed} bytes")
        self.needed = needed


@dataclass(frozen=True)
class KVEntry:
    key: str
    vtype: int
    value: Any  # scalars and strings; arrays: a list for scalar elements, None otherwise
    start: int  # byte span of the whole entry (key included) in the file
    end: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (contiguous)
    type: int
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.type, self.n_elements)


@dataclass
class GGUFLayout:
    version: int
    kv: dict[str, KVEntry]
    tensors: list[TensorInfo]
    kv_end: int  # end of the metadata section = start of the tensor infos
    alignment: int
    data_start: int

    def get(self, key: str, default: Any = None) -> Any:
        entry = self.kv.get(key)
        return default if entry is None else entry.value

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "") or "")

    @property
    def context_length(self) -> int | None:
        value = self.get(f"{self.architecture}.context_length")
        return int(value) if value is not None else None

    def type_counts(self) -> Counter[str]:
        return Counter(t.type_name for t in self.tensors)

    @property
    def quantization(self) -> str:
        """``Q4_K_M``-style label: ``general.file_type`` when present, else the type holding
        the most bytes."""
        ftype = self.get("general.file_type")
        if isinstance(ftype, int):
            try:
                return LlamaFileType(ftype).name.removeprefix("MOSTLY_").removeprefix("ALL_")
            except ValueError:
                pass
        by_bytes: Counter[str] = Counter()
        for t in self.tensors:
            by_bytes[t.type_name] += t.nbytes
        return by_bytes.most_common(1)[0][0] if by_bytes else ""

    @property
    def parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)


def tensor_nbytes(type_id: int, n_elements: int) -> int:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except ValueError as exc:
        name = RETIRED_GGUF_TYPES.get(type_id, f"type id {type_id}")
        raise GGUFFormatError(
            f"tensor type {name} is unknown to this version of the gguf library"
        ) from exc
    return n_elements // block * size


class _Cursor:
    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise Truncated(self.pos + n)

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.need(n)
        value = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return value

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        self.need(n)
        self.pos += n


# Arrays of arrays nest this deep at most (real files: one level, the vocabulary's merges).
MAX_ARRAY_DEPTH = 8


def _value(cur: _Cursor, vtype: int, depth: int = 0) -> Any:
    if depth > MAX_ARRAY_DEPTH:
        raise GGUFFormatError(f"metadata arrays nest deeper than {MAX_ARRAY_DEPTH} levels")
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype])
    if vtype == _STRING:
        return cur.string()
    if vtype != _ARRAY:
        raise GGUFFormatError(f"unknown GGUF value type {vtype}")
    etype = cur.unpack("<I")
    count = cur.unpack("<Q")
    if etype in _SCALARS:
        fmt = _SCALARS[etype]
        size = struct.calcsize(fmt)
        cur.need(size * count)
        values = list(struct.unpack_from(f"<{count}{fmt[1]}", cur.buf, cur.pos))
        cur.pos += size * count
        return values
    if etype == _STRING:
        for _ in range(count):
            cur.skip_string()
        return None
    if etype == _ARRAY:
        for _ in range(count):
            _value(cur, _ARRAY, depth + 1)
        return None
    raise GGUFFormatError(f"unknown GGUF array element type {etype}")


def parse_layout(buf: Any) -> GGUFLayout:
    """The layout from a buffer holding the file or a prefix of it (`Truncated` when the
    prefix is too short; `GGUFFormatError` when it is not GGUF)."""
    cur = _Cursor(buf)
    cur.need(4)
    if bytes(buf[:4]) != MAGIC:
        raise GGUFFormatError("not a GGUF file (it lacks the GGUF magic)")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors = cur.unpack("<Q")
    n_kv = cur.unpack("<Q")
    kv: dict[str, KVEntry] = {}
    for _ in range(n_kv):
        start = cur.pos
        key = cur.string()
        vtype = cur.unpack("<I")
        value = _value(cur, vtype)
        kv[key] = KVEntry(key, vtype, value, start, cur.pos)
    kv_end = cur.pos
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
        ttype = cur.unpack("<I")
        offset = cur.unpack("<Q")
        tensors.append(TensorInfo(name, dims, ttype, offset))
    alignment = kv["general.alignment"].value if "general.alignment" in kv else DEFAULT_ALIGNMENT
    if not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
        raise GGUFFormatError(f"invalid general.alignment {alignment!r}")
    data_start = -(-cur.pos // alignment) * alignment
    return GGUFLayout(
        version=version,
        kv=kv,
        tensors=tensors,
        kv_end=kv_end,
        alignment=alignment,
        data_start=data_start,
    )


def read_layout(path: Path | str) -> GGUFLayout:
    """The layout of the GGUF file at `path` (memory-mapped; only the head is read)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise GGUFFormatError(f"{path} is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                layout = parse_layout(mm)
            except Truncated as exc:
                raise GGUFFormatError(f"{path} ends inside its header (truncated?)") from exc
    end = max((t.offset + t.nbytes for t in layout.tensors), default=0)
    if layout.tensors and layout.data_start + end > size:
        raise GGUFFormatError(
            f"{path} is truncated: its tensors need {layout.data_start + end} bytes, it has {size}"
        )
    return layout


def encode_kv(key: str, vtype: int, value: Any) -> bytes:
    """One metadata entry as GGUF bytes (scalars and strings; what conversions add)."""
    out = struct.pack("<Q", len(key.encode())) + key.encode() + struct.pack("<I", vtype)
    if vtype == _STRING:
        raw = str(value).encode()
        return out + struct.pack("<Q", len(raw)) + raw
    if vtype in _SCALARS:
        return out + struct.pack(_SCALARS[vtype], value)
    raise ValueError(f"cannot encode GGUF value type {vtype}")


UINT32 = _UINT32
STRING = _STRING
