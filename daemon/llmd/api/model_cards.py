"""What the API says about a served model: the context it is served with and what it can do.

Why it matters: agents size their history compaction from the context length a server
reports (opencode and Codex read `/v1/models`, Ollama clients `/api/show`); a server that
reports none, or the trained length while serving less, gets prompts it must refuse. So every
listing reports the context the engine serves (the running worker's, else what `--context-
length` or the model's own metadata says it will be), under the names clients look for:
`context_length` (OpenRouter, LM Studio), `max_model_len` (vLLM, SGLang), and Ollama's
`model_info["<arch>.context_length"]`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmd.runtime.model_registry import ModelRegistry
from llmd.store.manifests import ModelRecord
from llmd.store.model_facts import describe
from llmd.store.model_kind import record_kind
from llmd.text.reasoning import reasoning_support

_FACTS: dict[tuple[str, float, int], dict[str, Any]] = {}


def facts_of(record: ModelRecord) -> dict[str, Any]:
    """model_facts.describe, read once per file version (it opens the weights' header)."""
    key = (record.path, record.modified, record.size)
    if key not in _FACTS:
        _FACTS[key] = describe(record)
    return _FACTS[key]


def served_context(registry: ModelRegistry, record: ModelRecord) -> int | None:
    """The context `record` is (or will be) served with: the running worker's; else the
    daemon's `--context-length`, which sets it (below or above the trained length); else the
    trained length from the model's metadata."""
    for model in registry.loaded():
        if model.name == record.name and model.worker and model.worker.ready:
            return model.worker.ready.context_length
    if registry.context_length:
        return registry.context_length
    trained = facts_of(record).get("context_length") or record.context_length
    return int(trained) if trained else None


def sees_images(record: ModelRecord) -> bool:
    """Whether the worker will run a vision tower for the model (worker/vision.py): a GGUF
    Gemma 3 or Qwen3.5-MoE pulled with its repo's llama.cpp mmproj, or a Gemma 3 or Qwen3.5
    multimodal checkpoint directory. What clients read before they offer image input
    (Ollama's `vision`)."""
    if record.format == "gguf":
        return bool(record.mmproj) and record.architecture in ("gemma3", "qwen35moe")
    try:
        config = json.loads((Path(record.path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") in ("gemma3", "qwen3_5", "qwen3_5_moe") and isinstance(
        config.get("vision_config"), dict
    )


def capabilities(record: ModelRecord) -> dict[str, bool]:
    """What requests the model serves: tools for every chat model (native markup or llmd's
    fallback prompt), reasoning for thinking templates; embeddings and rerank from the kind
    decided at pull (model_kind.py); vision for a model whose vision tower llmd runs."""
    kind = record_kind(record).kind
    template = facts_of(record).get("template") or "" if kind == "generate" else ""
    return {
        "completion": kind == "generate",
        "chat": bool(template),
        "tools": bool(template),
        "reasoning": bool(template) and reasoning_support(template, None).is_reasoning_model,
        "vision": kind == "generate" and sees_images(record),
        "embeddings": kind == "embed",
        "rerank": kind == "rerank",
    }


def openai_model(registry: ModelRegistry, record: ModelRecord) -> dict[str, Any]:
    """A `/v1/models` entry: OpenAI's four fields plus the context and capabilities."""
    context = served_context(registry, record)
    facts = facts_of(record)
    return {
        "id": record.name,
        "object": "model",
        "created": int(record.modified),
        "owned_by": "llmd",
        "context_length": context,
        "max_model_len": context,
        "trained_context_length": facts.get("context_length") or record.context_length,
        "capabilities": capabilities(record),
        "architecture": facts.get("architecture") or record.architecture or None,
        "quantization": facts.get("quantization") or record.quantization or None,
        "kind": record_kind(record).kind,
    }
