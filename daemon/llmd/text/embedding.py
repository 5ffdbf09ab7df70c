"""Embedding and rerank requests, protocol-agnostic: texts in, token ids checked against the
context, one engine sequence per input (all submitted at once, so the engine batches them into
the same steps), vectors or scores out. The OpenAI, Ollama and rerank routes are thin shapes
around it (embedding_routes.py, ollama_embed.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding

from llmd.errors import ApiError
from llmd.runtime.counters import observe_embedding
from llmd.runtime.supervisor import ModelSupervisor
from llmd.runtime.worker_client import WorkerError
from llmd.store.model_kind import ModelKind, record_kind
from llmd.store.model_store import ModelStore
from llmd.text.generation import _api_error
from llmd.text.text_model import TextModel

MAX_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


class WrongKind(ApiError):
    """A model asked for what it is not for (chat of an embedding model, or the reverse)."""

    def __init__(self, model: str, kind: ModelKind, wanted: str, route: str) -> None:
        nouns = {"generate": "text generation", "embed": "embeddings", "rerank": "reranking"}
        super().__init__(
            400,
            f"model '{model}' is a{'n' if kind.kind == 'embed' else ''} {kind.kind} model: it "
            f"does not serve {nouns[wanted]} ({route}); its kind was decided when it was "
            "pulled (see `llmd show`)",
            param="model",
            code="wrong_model_kind",
        )


def require_kind(model: ModelSupervisor, wanted: str, route: str) -> ModelKind:
    """The model's kind when it is `wanted`, else a 400 naming both."""
    kind = record_kind(model.record)
    if kind.kind != wanted:
        raise WrongKind(model.name, kind, wanted, route)
    return kind


def check_kind_before_load(store: ModelStore, name: str, wanted: str, route: str) -> None:
    """The wrong-kind 400 from the manifest alone, before a load that could evict another
    model just to refuse the request (an unknown name is left for the registry's 404)."""
    record = store.resolve(name)
    if record is not None and record_kind(record).kind != wanted:
        raise WrongKind(name, record_kind(record), wanted, route)


def embedding_tokens(text: TextModel, value: str, limit: int | None = None) -> list[int]:
    """The token ids of one input as the model's own tokenizer makes them for an embedding:
    with its post-processor's special tokens (Qwen3-Embedding's tokenizer appends
    <|endoftext|>, the token its last-token pooling reads; a GGUF asks for it with
    add_eos_token), and its BOS where it wants one.

    `limit` (a request that asked for truncation): at most that many ids, cut as
    sentence-transformers' tokenizer cuts a long text - the text's own tokens lose their tail
    and the special tokens stay (an encoder's [SEP] or </s>, the end token a last-token
    pooling reads), so a truncated input embeds as the reference library embeds it."""
    encoding = text.tokenizer.encode(value, add_special_tokens=False)
    ids = _with_special_tokens(text, encoding)
    if limit is not None and len(ids) > limit:
        encoding.truncate(max(0, len(encoding.ids) - (len(ids) - limit)))
        ids = _with_special_tokens(text, encoding)
    return ids


def _with_special_tokens(text: TextModel, encoding: Encoding) -> list[int]:
    ids = list(text.tokenizer.post_process(encoding, add_special_tokens=True).ids)
    if text.add_bos and text.bos_id is not None and (not ids or ids[0] != text.bos_id):
        ids = [text.bos_id, *ids]
    if text.add_eos_id is not None and (not ids or ids[-1] != text.add_eos_id):
        ids.append(text.add_eos_id)
    return ids


def fit_context(ids: list[int], context_length: int, *, truncate: bool, param: str) -> list[int]:
    """`ids` when they fit the served context; the first `context_length` of them when the
    request asked for truncation (texts were already cut by embedding_tokens, keeping their
    special tokens; token ids given by the client are cut as given); otherwise a 400 naming
    the input."""
    if not ids:
        raise ApiError(400, f"{param} is empty: there is nothing to embed", param=param)
    if len(ids) <= context_length:
        return ids
    if truncate:
        return ids[:context_length]
    raise ApiError(
        400,
        f"{param} has {len(ids)} tokens, more than the model's context of {context_length} "
        "tokens; shorten it or ask for truncation",
        param=param,
        code="context_length_exceeded",
    )


@dataclass
class Pooled:
    """The results of one request's inputs, in input order."""

    values: list[list[float]]
    prompt_tokens: int


async def run_pooled(
    model: ModelSupervisor,
    prompts: Sequence[list[int]],
    *,
    output: str = "embedding",
    logit_tokens: list[int] | None = None,
) -> Pooled:
    """Runs every prompt as one engine sequence, all queued together (the engine admits them
    into the same steps). A failure of one fails the request and cancels the others, as the
    client going away (this task cancelled) does. A request whose worker dies is sent once
    more to the restarted worker (an embedding has no partial output a client has seen, so
    the retry is invisible but for the delay); a second death is reported, as the request
    itself may be what kills it."""
    kind = record_kind(model.record)
    retried = False
    while True:
        worker = await model.ensure_ready()
        try:
            done, rows = await worker.embed(
                list(prompts),
                output=output,
                pooling=kind.pooling or "last",
                normalize=kind.normalize,
                logit_tokens=logit_tokens,
            )
            break
        except WorkerError as exc:
            if exc.code == "worker_died" and not retried:
                retried = True
                continue
            raise _api_error(exc) from exc
    observe_embedding(model.metrics, model.name, len(rows), done.prompt_tokens)
    return Pooled(rows, done.prompt_tokens)


def truncated(
    vectors: list[list[float]], dimensions: int | None, kind: ModelKind, model: str
) -> list[list[float]]:
    """The vectors cut to their first `dimensions` values and L2-normalised again (Matryoshka
    truncation, as sentence-transformers' truncate_dim then Normalize), for a model trained for
    it; `vectors` as they are when no `dimensions` was asked; otherwise a 400 naming why."""
    if dimensions is None:
        return vectors
    if not kind.matryoshka:
        raise ApiError(
            400,
            f"dimensions is not supported for model '{model}': its model card does not say it "
            "was trained for Matryoshka truncation, and cutting its embeddings would degrade them",
            param="dimensions",
            code="unsupported_parameter",
        )
    width = len(vectors[0]) if vectors else dimensions
    if dimensions > width:
        raise ApiError(
            400,
            f"dimensions ({dimensions}) exceeds model '{model}''s embedding width of {width}",
            param="dimensions",
        )
    return [l2_normalized(v[:dimensions]) for v in vectors]


def l2_normalized(vector: list[float]) -> list[float]:
    """The vector scaled to unit length (a zero vector stays zero)."""
    norm = math.sqrt(sum(v * v for v in vector))
    return vector if norm == 0 else [v / norm for v in vector]
