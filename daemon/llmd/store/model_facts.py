"""What `llmd show` prints about an installed model, read from its own files (GGUF metadata or
config.json / tokenizer_config.json) plus the manifest, so it is true of the bytes served."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from llmd.store.gguf_layout import GGUFFormatError, GGUFLayout, read_layout
from llmd.store.manifests import ModelRecord
from llmd.store.model_kind import record_kind
from llmd.store.model_support import NATIVE_GGUF_TYPES


def describe(record: ModelRecord) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "name": record.name,
        "format": record.format,
        "architecture": record.architecture,
        "kind": record_kind(record).describe(),
        "quantization": record.quantization,
        "context_length": record.context_length,
        "license": record.license,
        "size": record.size,
        "digest": record.digest,
        "source": record.source,
        "modified": record.modified,
        "note": record.note,
        "path": record.path,
        "kv_type": record.kv_type,  # the model's own --kv-type ("": the daemon's)
    }
    path = Path(record.path)
    if record.format == "gguf":
        facts.update(_gguf_facts(path))
        upstream = record.source.rsplit("/", 1)[-1] if "/" in record.source else path.name
        facts["files"] = [
            {"name": upstream, "path": str(path), "digest": record.digest, "size": record.size}
        ]
        mmproj = Path(record.mmproj) if record.mmproj else None
        if mmproj is not None and mmproj.exists():  # llama.cpp's vision tower, pulled with it
            facts["files"].append(
                {
                    "name": "mmproj (vision tower)",
                    "path": str(mmproj),
                    "digest": "sha256:" + mmproj.name.removeprefix("sha256-"),
                    "size": mmproj.stat().st_size,
                }
            )
    else:
        facts.update(_tree_facts(path))
        facts["files"] = list(record.files) or [
            {"name": p.name, "size": p.stat().st_size} for p in sorted(path.iterdir())
        ]
    if not facts.get("license"):
        facts["license"] = record.license
    return facts


def _gguf_facts(path: Path) -> dict[str, Any]:
    try:
        layout = read_layout(path)
    except (OSError, GGUFFormatError) as exc:
        return {"error": f"cannot read {path}: {exc}"}
    arch = layout.architecture
    return {
        "architecture": arch,
        "quantization": layout.quantization,
        "tensor_types": dict(layout.type_counts()),
        "parameters": layout.parameters,
        "context_length": layout.context_length,
        "embedding_length": layout.get(f"{arch}.embedding_length"),
        "layers": layout.get(f"{arch}.block_count"),
        "license": layout.get("general.license") or "",
        "template": layout.get("tokenizer.chat_template") or "",
        "converted_from": layout.get("llmd.converted_from") or "",
        "engine": engine_summary(layout),
    }


def engine_summary(layout: GGUFLayout) -> str:
    """What the engine does with each tensor type: which run on its own kernels (or as
    floats), and what the pull converted from what (`llmd.converted_from`, written by
    convert.py). A type it can do neither with cannot be installed (install.check_gguf)."""
    runs = Counter((t.type_name, t.type in NATIVE_GGUF_TYPES) for t in layout.tensors)
    native = ", ".join(f"{name} {n}" for (name, ok), n in runs.items() if ok)
    other = ", ".join(f"{name} {n}" for (name, ok), n in runs.items() if not ok)
    text = f"native kernels: {native}" if native else "no tensor runs natively"
    if other:
        text += f"; not runnable: {other}"
    if converted := layout.get("llmd.converted_from"):
        text += f"; converted at pull from the source's {converted}"
    return text


def _tree_facts(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return out
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    out["architecture"] = text.get("model_type") or config.get("model_type") or ""
    out["context_length"] = text.get("max_position_embeddings")
    out["embedding_length"] = text.get("hidden_size")
    out["layers"] = text.get("num_hidden_layers")
    template = ""
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        template = jinja.read_text()
    else:
        try:
            tok = json.loads((path / "tokenizer_config.json").read_text())
            template = tok.get("chat_template") or ""
        except (OSError, ValueError):
            pass
    out["template"] = template if isinstance(template, str) else json.dumps(template)
    return out
