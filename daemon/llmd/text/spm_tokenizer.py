"""SentencePiece-style vocabularies of GGUF files, rebuilt as Hugging Face `tokenizers`.

Two GGUF tokenizer models write text as SentencePiece does (spaces become U+2581 "▁", no
byte-level alphabet, byte tokens `<0xXX>` for characters outside the vocabulary):

- ``llama`` (Llama 2, Mistral, Gemma 1-3): the file carries pieces and scores but no merges.
  llama.cpp tokenizes by repeatedly joining the adjacent pair whose join is a piece with the
  highest score. That is BPE whose merge ranks follow the joined piece's score, so the merges
  are derived from the scores (every split of every piece into two pieces; the approach of
  transformers' SentencePiece converter) and `tokenizers`' BPE runs them.
- ``gemma4``: BPE with its merges in the file, run on raw UTF-8 over the whole text with only
  newline runs split off.

Checked id for id against llama.cpp's own tokenizer test data for its llama-spm and gemma-4
vocabularies (tests/unit/test_llamacpp_vocabularies.py).
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPACE = "\u2581"

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's highest-score-first joining: for each piece,
    every split into two pieces of the vocabulary, ranked by the piece's score (ties keep the
    vocabulary order, as llama.cpp's queue does for equal scores)."""
    index = {tok: i for i, tok in enumerate(tokens)}
    ranked: list[tuple[float, int, int, int]] = []
    for piece_id, piece in enumerate(tokens):
        for cut in range(1, len(piece)):
            left = index.get(piece[:cut])
            right = index.get(piece[cut:])
            if left is not None and right is not None:
                ranked.append((-scores[piece_id], piece_id, left, right))
    ranked.sort()
    return [(tokens[left], tokens[right]) for _, _, left, right in ranked]


def special_tokens(tokens: list[str], token_types: list[int]) -> list[AddedToken]:
    """Control and user-defined tokens, matched whole inside text (llama-server parses them in
    rendered templates the same way)."""
    return [
        AddedToken(tok, special=(typ == CONTROL), normalized=False)
        for tok, typ in zip(tokens, token_types, strict=True)
        if typ in (CONTROL, USER_DEFINED)
    ]


def _sentencepiece_decoder(strip_prefix: bool) -> decoders.Decoder:
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


def _unknown(tokens: list[str], token_types: list[int], unk_id: int | None) -> str | None:
    if unk_id is not None and 0 <= unk_id < len(tokens):
        return tokens[unk_id]
    return next((t for t, typ in zip(tokens, token_types, strict=True) if typ == UNKNOWN), None)


def spm_tokenizer(
    tokens: list[str],
    scores: list[float],
    token_types: list[int],
    *,
    add_space_prefix: bool,
    unk_id: int | None = None,
) -> Tokenizer:
    """llama.cpp's ``llama`` (SentencePiece) tokenizer. With `add_space_prefix` (Llama 2,
    Mistral; not Gemma) a "▁" is put before the text and after every special token, as
    llama.cpp does, and the decoder drops the first one."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges_from_scores(tokens, scores),
            unk_token=_unknown(tokens, token_types, unk_id),
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    tk.normalizer = normalizers.Sequence(steps)
    tk.decoder = _sentencepiece_decoder(strip_prefix=add_space_prefix)
    tk.add_special_tokens(special_tokens(tokens, token_types))
    return tk


def gemma4_tokenizer(
    tokens: list[str], token_types: list[int], merges: list[str], unk_id: int | None = None
) -> Tokenizer:
    """llama.cpp's ``gemma4`` tokenizer: the file's BPE merges over raw UTF-8, spaces as "▁",
    runs of newlines split from the rest (and taken whole when the run is one token)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=pairs,
            unk_token=_unknown(tokens, token_types, unk_id),
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tk.normalizer = normalizers.Replace(" ", SPACE)
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tk.decoder = _sentencepiece_decoder(strip_prefix=False)
    tk.add_special_tokens(special_tokens(tokens, token_types))
    return tk
