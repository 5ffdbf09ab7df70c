"""What a model is for - generating text, embedding it, or reranking documents - decided once
at pull time from the model's own files and stored in its manifest, so every route can refuse
the wrong use with a clear 400 without loading anything.

How the kind is decided (issue 23, phase 1):

- **Hugging Face directory:** a sentence-transformers ``modules.json`` naming a Pooling module
  makes it an embedding model; its ``1_Pooling/config.json`` gives the pooling mode
  (``pooling_mode_lasttoken``, ``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``) and a
  ``Normalize`` module in ``modules.json`` L2-normalises the result (what
  ``SentenceTransformer.encode`` returns).
- **Dense modules** (``modules.json`` entries of type Dense, after the Pooling module) project
  the pooled vector before the Normalize module; the worker applies them (store/dense_modules.py), so a
  pull copies their directories.
- **GGUF:** llama.cpp's converter writes ``{arch}.pooling_type`` for embedding and rerank files
  (1 mean, 2 cls, 3 last, 4 rank); a GGUF embedding is normalised, as llama-server returns it
  by default.
- **Cross-encoders** (bge-reranker, ms-marco MiniLM): a reranker directory whose config names
  a ``*ForSequenceClassification`` architecture of an encoder family, or an encoder GGUF with
  pooling_type rank or, without a pooling_type, a classifier head (``cls.output``: what the
  converter writes for bge-reranker-v2-m3); the kind records pooling "cls" (the classifier
  reads the CLS row).
- **Rerankers:** a Qwen3-Reranker is a plain ``Qwen3ForCausalLM`` with no marker in its files,
  so a directory is a reranker when its name (the hub repo or the local directory) contains
  ``reranker`` (case-insensitive), or when the pull asks for it (``llmd pull --kind rerank``,
  ``"kind"`` in the pull API; any kind may be asked for a directory, none for a GGUF). Its score is
  P("yes") over the "yes"/"no" next-token logits after the Qwen3-Reranker prompt
  (rerank.py). A decoder GGUF with pooling_type rank is refused for now: llama.cpp's
  converter replaces its lm_head with a two-row ``cls.output`` the engine does not load yet.

Encoders (issue 23, phase 2: BERT, XLM-RoBERTa, nomic-bert) embed, or rerank as
cross-encoders; they never generate. So does a Gemma 3 text model whose config.json sets
``use_bidirectional_attention`` (EmbeddingGemma: mean pooling, two Dense modules, Normalize):
it only embeds, and needs its sentence-transformers files to say how. An embedding directory of one
needs its sentence-transformers Pooling module, and may pool by CLS token, which a decoder
cannot (its first token has seen nothing). Poolings no engine runs (max, weighted mean) are
refused at pull with the reason.

**Matryoshka truncation** (``dimensions``) is allowed only for a model that says it was trained
for it: its model card (README.md) names Matryoshka representation learning ("Matryoshka" or
"MRL": nomic-embed-text-v1.5, Qwen3-Embedding, EmbeddingGemma do). GGUF files carry no such
statement, so their ``dimensions`` stay refused. Cutting another model's vectors would
silently degrade them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from llmd.store.dense_modules import dense_problem

Kind = Literal["generate", "embed", "rerank"]
KINDS: tuple[str, ...] = ("generate", "embed", "rerank")

# llama.cpp's enum llama_pooling_type (gguf.PoolingType)
_GGUF_POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}
_ST_POOLING = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
# What the engine pools (engine.h, GenerateRequest::Pooling); "cls" on encoders only.
RUNNABLE_POOLING = ("last", "mean", "cls")


class KindError(ValueError):
    """The model's kind or pooling is one llmd cannot serve; the message says why."""


@dataclass(frozen=True)
class ModelKind:
    kind: Kind = "generate"
    pooling: str = ""  # embed: "last" or "mean"
    normalize: bool = False  # embed: L2-normalise the pooled vector
    matryoshka: bool = False  # embed: trained for truncation (``dimensions`` allowed)

    def describe(self) -> str:
        """`llmd show`'s line: 'embed (last-token pooling, normalized)'."""
        if self.kind == "rerank" and self.pooling == "cls":
            return "rerank (cross-encoder)"
        if self.kind != "embed":
            return self.kind
        extra = ", normalized" if self.normalize else ""
        extra += ", Matryoshka" if self.matryoshka else ""
        pooling = {"mean": "mean", "cls": "CLS-token"}.get(self.pooling, f"{self.pooling}-token")
        return f"embed ({pooling} pooling{extra})"


GENERATE = ModelKind()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _embed_kind(pooling: str, normalize: bool, what: str) -> ModelKind:
    if pooling not in RUNNABLE_POOLING:
        raise KindError(
            f"{what}: {pooling} pooling is not supported yet (llmd pools by last token, mean "
            "or CLS token)"
        )
    return ModelKind("embed", pooling, normalize)


_MATRYOSHKA = re.compile(r"matryoshka|\bMRL\b", re.IGNORECASE)


def declares_matryoshka(directory: Path) -> bool:
    """Whether the directory's model card says the model was trained for truncation."""
    try:
        card = (directory / "README.md").read_text(errors="replace")
    except OSError:
        return False
    return bool(_MATRYOSHKA.search(card))


def with_matryoshka(kind: ModelKind, declared: bool) -> ModelKind:
    """`kind` marked as truncatable when `declared` (an embedding model only)."""
    if not declared or kind.kind != "embed":
        return kind
    return replace(kind, matryoshka=True)


def kind_of_hf_dir(directory: Path, name: str, requested: str | None = None) -> ModelKind:
    """The kind of a Hugging Face directory (see the module docstring); `name` is the repo or
    directory name, `requested` a pull's explicit ``kind``. Raises KindError."""
    return with_matryoshka(
        _kind_of_hf_dir(directory, name, requested), declares_matryoshka(directory)
    )


def _kind_of_hf_dir(directory: Path, name: str, requested: str | None) -> ModelKind:
    what = str(name)
    if requested == "generate":
        return GENERATE
    if requested == "rerank" or (requested is None and "reranker" in name.lower()):
        # A sequence-classification checkpoint is a cross-encoder: its classifier scores the
        # CLS row of the (query, document) pair (pooling "cls").
        config = _read_json(directory / "config.json")
        archs = config.get("architectures") if isinstance(config, dict) else None
        classifier = any(str(a).endswith("ForSequenceClassification") for a in archs or [])
        return ModelKind("rerank", "cls" if classifier else "")
    modules = _read_json(directory / "modules.json")
    pooling_module = None
    normalize = False
    if isinstance(modules, list):
        for m in modules:
            if not isinstance(m, dict):
                continue
            kind = str(m.get("type", ""))
            if kind.endswith("Pooling"):
                pooling_module = str(m.get("path", "1_Pooling"))
            elif kind.endswith("Normalize"):
                normalize = True
            elif kind.endswith("Dense"):
                # Applied by the worker after pooling (store/dense_modules.py).
                if problem := dense_problem(directory, str(m.get("path", ""))):
                    raise KindError(f"{what}: {problem}")
    if pooling_module is None:
        if requested == "embed":
            return _embed_kind("last", True, what)  # Qwen3-Embedding's own setting
        return GENERATE
    config = _read_json(directory / pooling_module / "config.json")
    if not isinstance(config, dict):
        raise KindError(
            f"{what}: modules.json names {pooling_module} but its config.json is unreadable"
        )
    modes = [mode for key, mode in _ST_POOLING.items() if config.get(key)]
    if len(modes) != 1:
        raise KindError(
            f"{what}: {pooling_module}/config.json sets {len(modes)} pooling modes, not one"
        )
    return _embed_kind(modes[0], normalize, what)


def kind_of_gguf(
    get: Any, arch: str, what: str, requested: str | None = None, classifier: bool = False
) -> ModelKind:
    """The kind of a GGUF file from ``{arch}.pooling_type``; `get` reads a metadata key.
    `classifier`: the file has a sequence-classification head (``cls.output``). llama.cpp's
    converter writes no pooling_type for an XLMRobertaForSequenceClassification checkpoint
    (bge-reranker-v2-m3: llama-server is told ``--reranking``), so on an encoder that head
    alone makes it a cross-encoder."""
    pooling = _GGUF_POOLING.get(int(get(f"{arch}.pooling_type", 0) or 0), "")
    if not pooling and classifier and arch in ENCODER_ARCHITECTURES:
        pooling = "rank"
    if requested == "generate" or (not pooling and requested is None):
        return GENERATE
    if pooling == "rank" or requested == "rerank":
        if arch in ENCODER_ARCHITECTURES:  # llama.cpp's cross-encoders: cls / cls.output head
            return ModelKind("rerank", "cls")
        raise KindError(
            f"{what}: reranking GGUF files (pooling_type rank) of decoders are not supported "
            "yet; pull the reranker's Hugging Face directory instead"
        )
    return _embed_kind(pooling or "last", True, what)


# Decoder architectures whose file (native/mlx/llama.cpp) returns hidden states; an embedding
# or rerank model of another one (EmbeddingGemma) is refused at pull.
POOLING_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Encoders (native/mlx/bert.cpp), by config.json model_type and GGUF general.architecture:
# they embed, or rerank as cross-encoders.
ENCODER_ARCHITECTURES = ("bert", "xlm-roberta", "nomic_bert", "nomic-bert")
# Decoders whose file runs them bidirectionally when config.json's use_bidirectional_attention
# says so (native/mlx/gemma3.cpp: EmbeddingGemma); such a model only embeds.
BIDIRECTIONAL_DECODERS = ("gemma3_text",)


def bidirectional_config(directory: Path) -> bool:
    """Whether the directory's config.json asks for bidirectional attention (EmbeddingGemma)."""
    config = _read_json(directory / "config.json")
    return isinstance(config, dict) and config.get("use_bidirectional_attention") is True


def check_architecture(
    kind: ModelKind, arch: str, what: str, bidirectional: bool = False
) -> ModelKind:
    """`kind` when llmd can serve it on `arch` (`bidirectional`: its config asks for
    bidirectional attention); KindError naming both otherwise."""
    if bidirectional and arch in BIDIRECTIONAL_DECODERS:
        if kind.kind != "embed":
            raise KindError(
                f"{what}: this {arch} model has bidirectional attention (an embedding model such "
                "as EmbeddingGemma), which embeds but never generates or reranks; its directory "
                "needs a sentence-transformers Pooling module (modules.json, "
                "1_Pooling/config.json) saying how to pool it"
            )
        return kind
    if arch in ENCODER_ARCHITECTURES:
        if kind.kind == "generate":
            raise KindError(
                f"{what}: {arch} is an encoder, which embeds or reranks but never generates; its "
                "directory has no sentence-transformers Pooling module (modules.json, "
                "1_Pooling/config.json) saying how to pool it, nor its GGUF a pooling_type"
            )
        if kind.kind == "rerank" and kind.pooling != "cls":
            raise KindError(
                f"{what}: {arch} reranks only as a cross-encoder (a *ForSequenceClassification "
                "checkpoint, or a GGUF with pooling_type rank); this one has no classifier"
            )
        return kind
    if kind.kind != "generate" and arch not in POOLING_ARCHITECTURES:
        raise KindError(
            f"{what}: {kind.kind} models of architecture {arch} are not supported yet "
            f"(llmd embeds and reranks with {', '.join(POOLING_ARCHITECTURES)} decoders, "
            f"and embeds with {', '.join(ENCODER_ARCHITECTURES)} encoders)"
        )
    if kind.kind == "rerank" and kind.pooling == "cls":
        raise KindError(
            f"{what}: sequence-classification rerankers of architecture {arch} are not "
            "supported yet (llmd reranks with Qwen3-Reranker-style decoders and encoder "
            "cross-encoders)"
        )
    if kind.pooling == "cls":
        raise KindError(
            f"{what}: CLS pooling needs an encoder; {arch} is a decoder, whose first token has "
            "seen nothing of the text"
        )
    return kind


def record_kind(record: Any) -> ModelKind:
    """The kind stored in a manifest (older manifests are generation models)."""
    kind = getattr(record, "kind", "") or "generate"
    return ModelKind(
        kind,
        getattr(record, "pooling", ""),
        bool(getattr(record, "normalize", False)),
        bool(getattr(record, "matryoshka", False)),
    )
