"""Tokenizers for the daemon's text world, built with Hugging Face `tokenizers`.

A GGUF file carries its vocabulary (and BPE merges or SentencePiece scores) and the names of its
tokenizer model and pre-tokenizer; this module rebuilds the same tokenizer llama.cpp uses from
them (checked id for id against llama.cpp's own tokenizer test data:
tests/unit/test_llamacpp_vocabularies.py). Byte-level BPE ("gpt2") lives here, the
SentencePiece-style models in spm_tokenizer.py, the encoders' WordPiece in wpm_tokenizer.py and
XLM-RoBERTa's unigram vocabulary in unigram_tokenizer.py. A Hugging Face directory brings its own
tokenizer.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from llmd.store.model_support import (
    DIGITS_THEN_GPT2_PRE,
    GPT2_PRE,
    IGNORE_MERGES_PRE,
    LLAMA3_PRE,
    QWEN2_PRE,
    QWEN35_PRE,
    UNIGRAM_MODELS,
    WORDPIECE_MODELS,
    gguf_tokenizer_problem,
)
from llmd.text.spm_tokenizer import gemma4_tokenizer, special_tokens, spm_tokenizer
from llmd.text.unigram_tokenizer import unigram_tokenizer
from llmd.text.wpm_tokenizer import wpm_tokenizer

# Pre-tokenizer regexes, as llama.cpp applies them per `tokenizer.ggml.pre` (src/llama-vocab.cpp)
# and as the models' own tokenizer.json files write them.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2 differs from Llama 3 only in splitting digits one by one.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5 keeps combining marks with their letters.
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class UnsupportedTokenizer(Exception):
    """The model's tokenizer is one llmd cannot reproduce exactly (yet); serving it with an
    approximation would silently change every prompt, so the model is refused instead."""


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in LLAMA3_PRE:
        return _split_then_bytes(_LLAMA3_SPLIT)
    if pre in QWEN2_PRE:
        return _split_then_bytes(_QWEN2_SPLIT)
    if pre in QWEN35_PRE:
        return _split_then_bytes(_QWEN35_SPLIT)
    if pre in GPT2_PRE:
        return byte_level
    raise UnsupportedTokenizer(gguf_tokenizer_problem("gpt2", pre))


def byte_level_tokenizer(
    pre: str, tokens: list[str], token_types: list[int], merges: list[str]
) -> Tokenizer:
    """Rebuild a GGUF's byte-level BPE tokenizer. Control and user-defined tokens are matched
    as whole tokens inside text, as llama-server does when it tokenizes a rendered template.
    An unknown `pre` raises UnsupportedTokenizer (_pre_tokenizer)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(
        models.BPE(
            vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=pre in IGNORE_MERGES_PRE
        )
    )
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(special_tokens(tokens, token_types))
    return tk


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer llama.cpp builds from a GGUF's `tokenizer.ggml.*` metadata."""
    model = meta.get("tokenizer.ggml.model", "gpt2")
    pre = meta.get("tokenizer.ggml.pre", "")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if problem := gguf_tokenizer_problem(model, pre, meta.get("general.architecture")):
        raise UnsupportedTokenizer(problem)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    if model in WORDPIECE_MODELS or model in UNIGRAM_MODELS:
        build = wpm_tokenizer if model in WORDPIECE_MODELS else unigram_tokenizer
        try:
            return build(meta)
        except ValueError as exc:  # a vocabulary without the special tokens it needs
            raise UnsupportedTokenizer(str(exc)) from exc
    if model == "llama":
        return spm_tokenizer(
            tokens,
            meta["tokenizer.ggml.scores"],
            types,
            # llama.cpp's default for SentencePiece files without the key
            add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
            unk_id=unk_id,
        )
    if model == "gemma4":
        return gemma4_tokenizer(tokens, types, meta["tokenizer.ggml.merges"], unk_id=unk_id)
    return byte_level_tokenizer(pre, tokens, types, meta.get("tokenizer.ggml.merges", []))


def tokenizer_from_dir(path: Path) -> Tokenizer:
    """A Hugging Face directory's own tokenizer.json: no reconstruction needed."""
    file = path / "tokenizer.json"
    if not file.exists():
        raise UnsupportedTokenizer(f"{path} has no tokenizer.json")
    return Tokenizer.from_file(str(file))
