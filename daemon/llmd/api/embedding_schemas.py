"""Request bodies of the embedding and rerank routes (OpenAI ``/v1/embeddings``, the
llama-server / Jina / Cohere ``/v1/rerank``, Ollama's ``/api/embed`` and ``/api/embeddings``),
validated with pydantic so every problem is a 400 naming its field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from llmd.runtime.keep_alive import CheckedKeepAlive
from llmd.runtime.protocol import INT32_MAX

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _Body(CheckedKeepAlive):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)


class EmbeddingRequest(_Body):
    """OpenAI's embeddings body, plus llmd's `truncate` (llama-server and Ollama truncate on
    request too): without it an input longer than the context is a 400."""

    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate: bool = False

    @field_validator("input")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("input is an empty list: there is nothing to embed")
        return v


class RerankRequest(_Body):
    """llama-server's, Jina's and Cohere's rerank body. `documents` are strings (Cohere's
    ``{"text": ...}`` objects too); `instruction` (llmd) replaces the reranker's default
    instruction; `truncate` (llmd) shortens documents that do not fit the context."""

    query: str
    documents: list[str | dict[str, str]] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    instruction: str | None = None
    truncate: bool = False

    def texts(self) -> list[str]:
        out = []
        for i, d in enumerate(self.documents):
            if isinstance(d, dict):
                if not isinstance(d.get("text"), str):
                    raise ValueError(f"documents.[{i}] has no 'text'")
                out.append(d["text"])
            else:
                out.append(d)
        return out


class OllamaEmbedRequest(_Body):
    """Ollama's ``/api/embed``: `truncate` defaults to true, as Ollama's does."""

    input: str | list[str] = ""
    truncate: bool = True
    options: dict[str, Any] | None = None
    dimensions: int | None = Field(default=None, ge=1)


class OllamaEmbeddingsRequest(_Body):
    """Ollama's older ``/api/embeddings``: one `prompt`, one `embedding`."""

    prompt: str = ""
    options: dict[str, Any] | None = None
