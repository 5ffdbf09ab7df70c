"""Whether two installed models share a vocabulary: the condition for one to draft for the
other in speculative decoding (they exchange token ids, so id i must be the same token in
both). Read from the files alone, without loading either model."""

from __future__ import annotations

import json
from pathlib import Path

from llmd.store.gguf_metadata import read_gguf_metadata


def tokens_of(path: Path | str) -> list[str]:
    """The model's tokens by id: a GGUF's `tokenizer.ggml.tokens`, or a Hugging Face
    directory's tokenizer.json vocabulary with its added tokens."""
    p = Path(path)
    if p.is_dir():
        raw = json.loads((p / "tokenizer.json").read_text(encoding="utf-8"))
        listed = raw.get("model", {}).get("vocab") or {}
        if isinstance(listed, list):  # Unigram: [piece, score] pairs in id order
            listed = {piece: i for i, (piece, _score) in enumerate(listed)}
        vocab = dict(listed)
        for added in raw.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
        out = [""] * (max(vocab.values(), default=-1) + 1)
        for token, i in vocab.items():
            out[i] = token
        return out
    return list(read_gguf_metadata(p).get("tokenizer.ggml.tokens") or [])


def vocabulary_mismatch(target: Path | str, draft: Path | str) -> str | None:
    """Why `draft` cannot draft for `target` (None: it can): a different number of tokens, or
    the first id whose token differs."""
    a, b = tokens_of(target), tokens_of(draft)
    if not a or not b:
        return "a model's vocabulary could not be read"
    if len(a) != len(b):
        return f"the vocabularies differ: {len(b)} tokens in the draft, {len(a)} in the model"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return f"the vocabularies differ: token {i} is {y!r} in the draft, {x!r} in the model"
    return None
