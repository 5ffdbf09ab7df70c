"""Reranking with a cross-encoder (bge-reranker, ms-marco MiniLM: an encoder with a
sequence-classification head): the query and each document are one input, joined as the
model's own tokenizer joins a pair ("[CLS] query [SEP] document [SEP]", RoBERTa's "<s> query
</s></s> document </s>"), and the relevance is the sigmoid of the classifier's logit on the
CLS row (the engine pools it and applies the head: native/mlx/bert.cpp). Truncation shortens
the document only, as sentence-transformers' CrossEncoder truncates "only_second" would cut the
longest text: the query is what every document is compared with.
"""

from __future__ import annotations

import math

from llmd.errors import ApiError
from llmd.text.text_model import TextModel


def pair_tokens(
    text: TextModel, query: str, document: str, *, context_length: int, truncate: bool, param: str
) -> list[int]:
    """The pair's token ids with the tokenizer's special tokens, within the context."""
    tokenizer = text.tokenizer
    first = tokenizer.encode(query, add_special_tokens=False)
    second = tokenizer.encode(document, add_special_tokens=False)
    room = context_length - len(first.ids) - tokenizer.num_special_tokens_to_add(is_pair=True)
    if len(second.ids) > room:
        if not truncate or room <= 0:
            raise ApiError(
                400,
                f"{param} makes an input of {len(first.ids) + len(second.ids)} tokens with the "
                f"query, more than the model's context of {context_length} tokens; shorten it "
                "or ask for truncation (truncate: true)",
                param=param,
                code="context_length_exceeded",
            )
        second.truncate(room)
    return list(tokenizer.post_process(first, second, add_special_tokens=True).ids)


def relevance(logits: list[float]) -> float:
    """The relevance in [0, 1]: the sigmoid of a one-label head's logit, or the probability of
    the second label ("relevant") of a two-label one."""
    if len(logits) == 1:
        return 1.0 / (1.0 + math.exp(-logits[0]))
    return 1.0 / (1.0 + math.exp(logits[0] - logits[1]))
