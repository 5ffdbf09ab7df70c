"""Pull-time conversion of GGUF files whose tensor types the engine cannot run natively.

Most GGUF files on the hub are K-quants (Q4_K_M, Q5_K_M, ...); the engine runs Q4_K, Q5_K,
Q6_K, Q2_K, Q3_K, Q5_0, Q5_1 and IQ4_NL natively but not the other IQ types. Such tensors become the
target chosen in ``model_support.CONVERSION_TARGET`` (for the reasons written there): re-encoded
keeping every code where the source is a special case of the target (``block_repack.REPACKS``:
IQ4_XS -> IQ4_NL, IQ3_S -> Q4_K, IQ3_XXS -> Q6_K, IQ2_XXS -> Q8_0), otherwise dequantized with gguf-py (``gguf.quants``,
the llama.cpp project's own Python package) and re-quantized to Q8_0; every other tensor is
copied byte for byte.

Memory stays bounded: tensors are converted a few million weights at a time straight from a
memory map of the source into the output file, never a whole model (or a whole embedding
table) in fp32. Metadata entries are copied verbatim from the source bytes, so the tokenizer,
chat template and every other key stay exactly as they were (``gguf.GGUFWriter`` would need
each value re-typed, cannot write empty arrays and wants whole tensors in memory); only
``general.file_type`` is updated and ``llmd.converted_from`` added, so the file itself says
what was done. Tests read the output back with ``gguf.GGUFReader``.
"""

from __future__ import annotations

import mmap
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
from gguf.quants import dequantize, quantize

from llmd.store.block_repack import REPACKS
from llmd.store.gguf_layout import (
    MAGIC,
    STRING,
    UINT32,
    GGUFFormatError,
    GGUFLayout,
    TensorInfo,
    encode_kv,
    tensor_nbytes,
)
from llmd.store.model_support import CONVERSION_TARGET, NATIVE_GGUF_TYPES, type_name

_CHUNK_ELEMENTS = 1 << 22  # weights per dequantize/quantize step (16 MiB of fp32)
_COPY_CHUNK = 1 << 24
_FILE_TYPE_OF = {
    GGMLQuantizationType[t]: LlamaFileType[f"MOSTLY_{t}"]
    for t in ("Q8_0", "Q6_K", "IQ4_NL", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "F16", "BF16")
}


class ConversionError(Exception):
    """The file cannot be made runnable (the message names the tensor type)."""


class ConversionCancelled(Exception):
    """The daemon is stopping; the partial output was removed."""


@dataclass
class ConversionPlan:
    """Which tensors change type, and the size of the converted file."""

    changes: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (from, to)
    source_size: int = 0
    output_size: int = 0

    @property
    def needed(self) -> bool:
        return bool(self.changes)

    def summary(self) -> str:
        """``Q5_0 -> Q8_0 (120 tensors), Q6_K kept`` style, for notes and progress."""
        pairs = Counter((type_name(a), type_name(b)) for a, b in self.changes.values())
        return ", ".join(f"{a} -> {b} ({n} tensors)" for (a, b), n in sorted(pairs.items()))

    def note(self) -> str:
        ratio = self.output_size / self.source_size if self.source_size else 1.0
        return (
            f"converted at pull time: {self.summary()}; the engine has no kernel for the "
            f"source type(s). Size {self.source_size / 1e6:.0f} MB -> "
            f"{self.output_size / 1e6:.0f} MB ({ratio:.2f}x)."
        )


def _target_for(t: TensorInfo) -> int | None:
    """The type `t` becomes, or None if it stays."""
    if t.type in NATIVE_GGUF_TYPES:
        return None
    target = CONVERSION_TARGET.get(t.type)
    if target is None:
        if t.type == GGMLQuantizationType.F64:
            return GGMLQuantizationType.F32
        raise ConversionError(
            f"tensor {t.name} is {t.type_name}, which llmd can neither run nor convert"
        )
    block = GGML_QUANT_SIZES[GGMLQuantizationType(target)][0]
    if t.dims[0] % block:
        return GGMLQuantizationType.F16  # rows that do not fit the target's blocks stay exact
    return target


def plan_conversion(layout: GGUFLayout, source_size: int = 0) -> ConversionPlan:
    """The conversion `layout` needs (empty when every tensor runs natively). Works on a
    layout parsed from a file's head, so the output size is known before any download."""
    changes = {}
    for t in layout.tensors:
        target = _target_for(t)
        if target is not None:
            changes[t.name] = (t.type, target)
    return plan_with(layout, changes, source_size)


def plan_with(
    layout: GGUFLayout, changes: dict[str, tuple[int, int]], source_size: int = 0
) -> ConversionPlan:
    """A plan for explicit type changes (name -> (from, to)), with its exact output size."""
    plan = ConversionPlan(changes=dict(changes), source_size=source_size)
    offset = 0
    for t in layout.tensors:
        ttype = plan.changes[t.name][1] if t.name in plan.changes else t.type
        offset = _align(offset, layout.alignment) + tensor_nbytes(ttype, t.n_elements)
    plan.output_size = _align(_out_header_size(layout, plan), layout.alignment) + offset
    return plan


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _new_kv(layout: GGUFLayout, plan: ConversionPlan) -> tuple[dict[str, bytes], list[bytes]]:
    """(replacements by key, appended entries) for the converted file's metadata."""
    targets = {to for _, to in plan.changes.values()}
    replace: dict[str, bytes] = {}
    append: list[bytes] = []
    if len(targets) == 1 and (ftype := _FILE_TYPE_OF.get(next(iter(targets)))) is not None:
        entry = encode_kv("general.file_type", UINT32, int(ftype))
        if "general.file_type" in layout.kv:
            replace["general.file_type"] = entry
        else:
            append.append(entry)
    note = encode_kv("llmd.converted_from", STRING, plan.summary())
    if "llmd.converted_from" in layout.kv:
        replace["llmd.converted_from"] = note
    else:
        append.append(note)
    return replace, append


def _tensor_info_bytes(t: TensorInfo, type_id: int, offset: int) -> bytes:
    name = t.name.encode()
    return (
        struct.pack("<Q", len(name))
        + name
        + struct.pack("<I", len(t.dims))
        + b"".join(struct.pack("<Q", d) for d in t.dims)
        + struct.pack("<IQ", type_id, offset)
    )


def _out_header_size(layout: GGUFLayout, plan: ConversionPlan) -> int:
    replace, append = _new_kv(layout, plan)
    size = 24
    for key, entry in layout.kv.items():
        size += len(replace[key]) if key in replace else entry.end - entry.start
    size += sum(len(a) for a in append)
    return size + sum(len(_tensor_info_bytes(t, 0, 0)) for t in layout.tensors)


def convert_gguf(
    src: Path,
    dst: Path,
    layout: GGUFLayout,
    plan: ConversionPlan,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Write the converted copy of `src` to `dst` (removed again on any failure).
    `progress(done, total)` counts source tensor bytes."""
    total = sum(t.nbytes for t in layout.tensors)
    done = 0
    try:
        with open(src, "rb") as fin, open(dst, "wb") as out:
            with mmap.mmap(fin.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                _write_header(mm, out, layout, plan)
                for t in layout.tensors:
                    if stop is not None and stop.is_set():
                        raise ConversionCancelled("the conversion was stopped")
                    out.write(b"\0" * (_align(out.tell(), layout.alignment) - out.tell()))
                    begin = layout.data_start + t.offset
                    view = memoryview(mm)[begin : begin + t.nbytes]
                    try:
                        if t.name in plan.changes:
                            _convert_tensor(view, t, plan.changes[t.name][1], out, stop)
                        else:
                            for i in range(0, t.nbytes, _COPY_CHUNK):
                                out.write(view[i : i + _COPY_CHUNK])
                    finally:
                        view.release()
                    done += t.nbytes
                    if progress is not None:
                        progress(done, total)
            out.flush()
        if dst.stat().st_size != plan.output_size:
            raise ConversionError(
                f"internal error: the converted file has {dst.stat().st_size} bytes, "
                f"{plan.output_size} were planned"
            )
    except BaseException:
        dst.unlink(missing_ok=True)
        raise


def _write_header(mm: mmap.mmap, out, layout: GGUFLayout, plan: ConversionPlan) -> None:  # type: ignore[no-untyped-def]
    replace, append = _new_kv(layout, plan)
    n_kv = len(layout.kv) + len(append)
    out.write(MAGIC + struct.pack("<IQQ", layout.version, len(layout.tensors), n_kv))
    for key, entry in layout.kv.items():
        out.write(replace[key] if key in replace else mm[entry.start : entry.end])
    for entry in append:
        out.write(entry)
    offset = 0
    for t in layout.tensors:
        type_id = plan.changes[t.name][1] if t.name in plan.changes else t.type
        offset = _align(offset, layout.alignment)
        out.write(_tensor_info_bytes(t, type_id, offset))
        offset += tensor_nbytes(type_id, t.n_elements)


def _convert_tensor(view: memoryview, t: TensorInfo, target: int, out, stop) -> None:  # type: ignore[no-untyped-def]
    row = t.dims[0]
    rows = t.n_elements // row
    row_bytes = tensor_nbytes(t.type, row)
    if row_bytes * rows != len(view):
        raise GGUFFormatError(f"tensor {t.name}: {len(view)} bytes do not fit its shape")
    raw = np.frombuffer(view, dtype=np.uint8).reshape(rows, row_bytes)
    step = max(1, _CHUNK_ELEMENTS // row)
    src_type = GGMLQuantizationType(t.type)
    dst_type = GGMLQuantizationType(target)
    repack = REPACKS.get((src_type, dst_type))  # lossless where the pair has one
    for r in range(0, rows, step):
        if stop is not None and stop.is_set():
            raise ConversionCancelled("the conversion was stopped")
        if repack is not None:
            out.write(repack(raw[r : r + step]).tobytes())
            continue
        weights = dequantize(raw[r : r + step], src_type).astype(np.float32, copy=False)
        if dst_type == GGMLQuantizationType.F16:
            out.write(weights.astype(np.float16).tobytes())
        elif dst_type == GGMLQuantizationType.F32:
            out.write(weights.tobytes())
        else:
            out.write(quantize(weights, dst_type).tobytes())
