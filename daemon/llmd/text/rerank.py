"""Reranking with a Qwen3-Reranker-style model: each (query, document) pair becomes the model
card's prompt, and the document's relevance is P("yes") from the softmax over the "yes" and
"no" next-token logits after it (the engine's token-logits request: no sampling, no lm_head
rows beyond those two are read back).

The prompt is the one Qwen3-Reranker was trained with (its model card): a system turn asking
for "yes" or "no", a user turn of ``<Instruct>``, ``<Query>`` and ``<Document>`` lines, then an
assistant turn opened with an empty think block. Prefix, pair and suffix are tokenized apart,
as the model card's ``process_inputs`` does; truncation shortens the pair only.
"""

from __future__ import annotations

import math

from llmd.errors import ApiError
from llmd.text.text_model import TextModel

SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def pair_text(query: str, document: str, instruction: str | None = None) -> str:
    """The user turn's content for one document (the model card's format_instruction)."""
    return (
        f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
        f"<Document>: {document}"
    )


def _encode(text: TextModel, value: str) -> list[int]:
    return list(text.tokenizer.encode(value, add_special_tokens=False).ids)


def yes_no_ids(text: TextModel) -> tuple[int, int]:
    """The token ids of "yes" and "no" in the model's vocabulary (a 400 when it lacks them:
    such a model was not trained to answer the reranker prompt)."""
    yes, no = text.tokenizer.token_to_id("yes"), text.tokenizer.token_to_id("no")
    if yes is None or no is None:
        raise ApiError(
            400,
            'the model\'s vocabulary has no "yes" / "no" tokens: it cannot score documents '
            "as a Qwen3-Reranker does",
            param="model",
        )
    return yes, no


def rerank_tokens(
    text: TextModel,
    query: str,
    document: str,
    *,
    instruction: str | None,
    context_length: int,
    truncate: bool,
    param: str,
) -> list[int]:
    """Prefix + pair + suffix token ids of one document, within the context."""
    head, tail = _encode(text, PREFIX), _encode(text, SUFFIX)
    pair = _encode(text, pair_text(query, document, instruction))
    room = context_length - len(head) - len(tail)
    if len(pair) > room:
        if not truncate or room <= 0:
            raise ApiError(
                400,
                f"{param} makes a prompt of {len(head) + len(pair) + len(tail)} tokens with the "
                f"query, more than the model's context of {context_length} tokens; shorten it "
                "or ask for truncation (truncate: true)",
                param=param,
                code="context_length_exceeded",
            )
        pair = pair[:room]
    return head + pair + tail


def relevance(yes_logit: float, no_logit: float) -> float:
    """P(yes) of the two-way softmax over the yes/no logits."""
    return 1.0 / (1.0 + math.exp(no_logit - yes_logit))
