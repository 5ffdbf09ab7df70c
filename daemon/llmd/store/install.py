"""From a verified GGUF file (or Hugging Face directory) to an installed model: refuse what the
engine cannot run, convert what it cannot run natively, publish a blob and a manifest.

Hub pulls (pulls.py) and local imports (`llmd pull ./model.gguf`) share these steps, so a
model is checked, converted and described the same way whatever its source.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from llmd.store.convert import ConversionError, ConversionPlan, convert_gguf, plan_conversion
from llmd.store.dense_modules import dense_paths
from llmd.store.engine_check import engine_refusal
from llmd.store.gguf_layout import GGUFFormatError, GGUFLayout, read_layout
from llmd.store.gguf_metadata import read_gguf_metadata
from llmd.store.hub import pick_mmproj
from llmd.store.manifests import (
    InsufficientStorage,
    Manifests,
    ModelRecord,
    StoreError,
    UnsupportedModel,
)
from llmd.store.model_kind import (
    GENERATE,
    KindError,
    ModelKind,
    bidirectional_config,
    check_architecture,
    kind_of_gguf,
    kind_of_hf_dir,
)
from llmd.store.model_support import (
    architecture_supported,
    gguf_architecture_supported,
    gguf_tokenizer_problem,
    quantization_problem,
    unsupported_architecture_message,
    unsupported_gguf_message,
)

_HF_DIR_SUFFIXES = {".json", ".safetensors", ".jinja", ".txt", ".model"}

# progress(phase, done, total): phase is "copying" or "converting"
Progress = Callable[[str, int, int], None]


def check_gguf(layout: GGUFLayout, what: str) -> ConversionPlan:
    """The conversion `layout` needs; UnsupportedModel when the engine cannot run it."""
    arch = layout.architecture
    if not gguf_architecture_supported(arch):
        raise UnsupportedModel(unsupported_gguf_message(arch, what))
    problem = gguf_tokenizer_problem(
        layout.get("tokenizer.ggml.model"), layout.get("tokenizer.ggml.pre"), arch
    )
    if problem:
        raise UnsupportedModel(f"{what}: {problem}")
    gguf_kind(layout, what)
    try:
        return plan_conversion(layout)
    except (ConversionError, GGUFFormatError) as exc:
        raise UnsupportedModel(f"{what}: {exc}") from exc


def gguf_kind(layout: GGUFLayout, what: str) -> ModelKind:
    """The GGUF's kind (model_kind.py); UnsupportedModel for one llmd cannot serve yet."""
    try:
        classifier = any(t.name == "cls.output.weight" for t in layout.tensors)
        kind = kind_of_gguf(layout.get, layout.architecture, what, classifier=classifier)
        return check_architecture(kind, layout.architecture, what)
    except KindError as exc:
        raise UnsupportedModel(str(exc)) from exc


def hf_kind(
    directory: Path, name: str, what: str, arch: str, requested: str | None = None
) -> ModelKind:
    """A Hugging Face directory's kind (model_kind.py; `requested`: the pull's ``kind``);
    UnsupportedModel when unservable."""
    try:
        kind = kind_of_hf_dir(directory, name, requested)
        return check_architecture(kind, arch, what, bidirectional_config(directory))
    except KindError as exc:
        raise UnsupportedModel(str(exc)) from exc


def check_engine_loads(store: Manifests, record: ModelRecord, what: str) -> ModelRecord:
    """`record` (not yet published) when the engine loads its file; otherwise its orphaned blob
    is removed and the pull fails with the loader's own reason (engine_check)."""
    refusal = engine_refusal(Path(record.path))
    if refusal is None:
        return record
    store.collect(record)
    raise UnsupportedModel(f"{what}: the engine cannot load it: {refusal}")


def hf_model_type(config: dict) -> str:
    """The architecture of a Hugging Face config.json (multimodal ones nest a text_config)."""
    model_type = config.get("model_type") or ""
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("model_type") and not architecture_supported(model_type):
        return str(text["model_type"])
    return str(model_type)


def check_hf_config(config: dict, what: str) -> str:
    arch = hf_model_type(config)
    if not architecture_supported(arch):
        raise UnsupportedModel(unsupported_architecture_message(arch, what))
    if problem := quantization_problem(config, arch):
        raise UnsupportedModel(f"{what}: {problem}")
    return arch


def gguf_record(
    store: Manifests,
    name: str,
    hexdigest: str,
    layout: GGUFLayout,
    source: str,
    *,
    note: str = "",
    source_digest: str = "",
    license: str = "",
) -> ModelRecord:
    blob = store.blob_path(hexdigest)
    kind = gguf_kind(layout, name)
    return ModelRecord(
        name=name,
        format="gguf",
        path=str(blob),
        size=blob.stat().st_size,
        digest=f"sha256:{hexdigest}",
        source=source,
        modified=time.time(),
        quantization=layout.quantization,
        architecture=layout.architecture,
        context_length=layout.context_length,
        license=license or str(layout.get("general.license", "") or ""),
        note=note,
        source_digest=source_digest or f"sha256:{hexdigest}",
        kind=kind.kind,
        pooling=kind.pooling,
        normalize=kind.normalize,
        matryoshka=kind.matryoshka,
    )


def convert_to_blob(
    store: Manifests,
    src: Path,
    layout: GGUFLayout,
    plan: ConversionPlan,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> str:
    """Convert `src` into a new blob (atomic publish); returns its hex digest. Blocking:
    async callers run it in a thread."""
    tmp = store.temp_path("convert")
    try:
        convert_gguf(src, tmp, layout, plan, progress, stop)
        digest = hashlib.sha256()
        with open(tmp, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        store.publish_blob(tmp, digest.hexdigest())
        return digest.hexdigest()
    finally:
        tmp.unlink(missing_ok=True)


def converted_blob_for(store: Manifests, source_digest: str) -> ModelRecord | None:
    """An installed model already converted from the upstream file `source_digest`: a
    re-pull (or a second name) reuses its blob instead of converting again."""
    for record in store.list():
        if record.source_digest == source_digest and record.note and Path(record.path).is_file():
            return record
    return None


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def check_local_source(path: Path) -> None:
    """StoreError (400) naming `path` unless it is a regular, non-empty file or a Hugging Face
    model directory. Only stat()ed, never opened: opening a FIFO blocks until a writer comes,
    and reading a device or a /proc file never ends or fails half-way."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StoreError(f"{path} cannot be read: {exc.strerror}") from exc
    if stat.S_ISDIR(st.st_mode):
        if not (path / "config.json").is_file() or not list(path.glob("*.safetensors")):
            raise StoreError(
                f"{path} is a directory but not a Hugging Face model directory "
                "(config.json + *.safetensors)"
            )
        return
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(
            f"{path} is {_kind(st.st_mode)}: only a GGUF file or a model directory can be pulled"
        )
    if st.st_size < 4:
        raise StoreError(f"{path} is empty (or a virtual file such as /proc's): not a GGUF file")


def insufficient_storage(needed: int, where: Path) -> InsufficientStorage:
    """A disk that filled up during a pull (ENOSPC): 507 naming the space needed."""
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = 0
    return InsufficientStorage(
        f"the disk holding {where} filled up during the pull: it needs about "
        f"{needed / 1e9:.2f} GB free ({free / 1e9:.2f} GB is). Free some space (`llmd gc` "
        "deletes unused blobs and old partial downloads, `llmd rm NAME` removes a model) "
        "and pull again."
    )


def import_local(
    store: Manifests,
    path: Path,
    name: str,
    source: str | None,
    progress: Progress | None = None,
    kind: str | None = None,
) -> ModelRecord:
    """`llmd pull ./file.gguf` / `./hf_dir`: checked, converted if needed, published.
    `kind` (a directory only) says what the model is for where its files cannot."""
    check_local_source(path)
    if kind is not None and not path.is_dir():
        raise kind_not_for_gguf()
    try:
        return _import_local(store, path, name, source, progress, kind)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        needed = (
            sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
        )
        raise insufficient_storage(needed, store.paths.models) from exc


def kind_not_for_gguf() -> StoreError:
    return StoreError(
        "a kind can be given for Hugging Face directories only: a GGUF file says its own "
        "(llama.cpp's converter writes {arch}.pooling_type for embedding models)",
        code="invalid_value",
    )


def _import_local(
    store: Manifests,
    path: Path,
    name: str,
    source: str | None,
    progress: Progress | None,
    kind: str | None = None,
) -> ModelRecord:
    if path.is_dir():
        return _import_dir(store, path, name, progress, kind)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise StoreError(f"{path} is not a GGUF file (it lacks the GGUF magic)")
    try:
        layout = read_layout(path)
    except GGUFFormatError as exc:
        raise StoreError(f"{path} cannot be read as GGUF: {exc}") from exc
    if not layout.tensors:
        raise StoreError(f"{path} holds no tensors: it is a GGUF header, not a model")
    if "tokenizer.ggml.tokens" not in layout.kv:  # (string arrays are skipped, not read)
        raise StoreError(
            f"{path} has no tokenizer (no tokenizer.ggml.tokens in its metadata): llmd cannot "
            "serve it; convert the model with its tokenizer (llama.cpp's convert_hf_to_gguf.py)"
        )
    plan = check_gguf(layout, str(path))
    source = source or f"file:{path.resolve()}"
    size = path.stat().st_size
    with store.pull_lock():
        if plan.needed:
            plan.source_size = size
            hexdigest = convert_to_blob(store, path, layout, plan, _phase(progress, "converting"))
            record = gguf_record(
                store,
                name,
                hexdigest,
                read_layout(store.blob_path(hexdigest)),
                source,
                note=plan.note(),
            )
        else:
            copying = _phase(progress, "copying")
            hexdigest = store.add_file(
                path, None if copying is None else (lambda done: copying(done, size))
            )
            record = gguf_record(store, name, hexdigest, layout, source)
        mmproj = local_mmproj(path, layout)
        if mmproj is not None:
            record = dataclasses.replace(
                record, mmproj=str(store.blob_path(store.add_file(mmproj, None)))
            )
        return store.write_manifest(check_engine_loads(store, record, str(path)))


def local_mmproj(path: Path, layout: GGUFLayout) -> Path | None:
    """llama.cpp's vision tower beside a local GGUF (`mmproj*.gguf` in its folder, chosen as
    from a hub repo), taken when its rows are the model's width (`clip.vision.projection_dim`
    is the model's embedding length): a folder of downloads may hold another model's."""
    names = [p.name for p in path.parent.glob("*.gguf") if p != path]
    chosen = pick_mmproj(names)
    if chosen is None:
        return None
    try:
        meta = read_gguf_metadata(path.parent / chosen)
    except (OSError, ValueError):
        return None
    width = meta.get("clip.vision.projection_dim")
    return (
        path.parent / chosen
        if width and width == layout.get(f"{layout.architecture}.embedding_length")
        else None
    )


def _mode(path: Path) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def _phase(progress: Progress | None, phase: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(phase, done, total)


def _import_dir(
    store: Manifests, src: Path, name: str, progress: Progress | None, kind_asked: str | None
) -> ModelRecord:
    config = src / "config.json"
    if not config.exists() or not list(src.glob("*.safetensors")):
        raise StoreError(
            f"{src} is not a Hugging Face model directory (config.json + *.safetensors)"
        )
    try:
        arch = check_hf_config(json.loads(config.read_text()), str(src))
    except ValueError as exc:
        raise StoreError(f"{config} is not valid JSON: {exc}") from exc
    kind = hf_kind(src, src.name, str(src), arch, kind_asked)
    wanted = [
        p
        for p in sorted(src.iterdir())
        if p.suffix in _HF_DIR_SUFFIXES and stat.S_ISREG(_mode(p))  # no FIFO behind a .json
    ]
    # The Dense modules' files: the worker applies them after pooling (store/dense_modules.py).
    for module in dense_paths(src):
        wanted += [src / module / "config.json", src / module / "model.safetensors"]
    total = sum(p.stat().st_size for p in wanted)
    done = 0
    files: list[tuple[str, str]] = []
    entries = []
    with store.pull_lock():
        for p in wanted:
            hexdigest = store.add_file(p)
            done += p.stat().st_size
            if progress is not None:
                progress("copying", done, total)
            rel = p.relative_to(src).as_posix()
            files.append((rel, hexdigest))
            entries.append({"name": rel, "digest": f"sha256:{hexdigest}", "size": p.stat().st_size})
        tree = store.make_tree(files)
        return store.write_manifest(
            tree_record(store, name, tree, entries, f"dir:{src.resolve()}", arch, kind=kind)
        )


def tree_record(
    store: Manifests,
    name: str,
    tree: Path,
    entries: list[dict],
    source: str,
    arch: str,
    license: str = "",
    kind: ModelKind = GENERATE,
) -> ModelRecord:
    config = json.loads((tree / "config.json").read_text())
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    dtype = config.get("torch_dtype") or config.get("dtype") or ""
    return ModelRecord(
        name=name,
        format="safetensors",
        path=str(tree),
        size=sum(e["size"] for e in entries),
        digest=f"sha256:{tree.name}",
        source=source,
        modified=time.time(),
        quantization=f"{bits}-bit" if bits else str(dtype),
        architecture=arch,
        context_length=config.get("max_position_embeddings"),
        license=license,
        files=tuple(entries),
        kind=kind.kind,
        pooling=kind.pooling,
        normalize=kind.normalize,
        matryoshka=kind.matryoshka,
    )
