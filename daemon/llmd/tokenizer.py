"""Tokenizers for the daemon's text world, built with Hugging Face `tokenizers`.

A GGUF file carries its BPE vocabulary, merges and pre-tokenizer name; this module rebuilds the
same tokenizer llama.cpp uses from them (checked token for token against llama.cpp's ids in
tests/fixtures). A Hugging Face directory brings its own tokenizer.json.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# GGUF token types (llama.cpp's llama_token_type)
_CONTROL = 3
_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class UnsupportedTokenizer(Exception):
    pass


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "qwen2"):
        # Digits split one by one, then GPT-2's byte-level regex (as these models' tokenizer.json)
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama-bpe", "llama3", "dbrx", "smaug-bpe"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre in ("gpt2", "default", ""):
        return byte_level
    raise UnsupportedTokenizer(f"GGUF pre-tokenizer '{pre}' is not supported yet")


def tokenizer_from_gguf_fields(
    model: str, pre: str, tokens: list[str], token_types: list[int], merges: list[str]
) -> Tokenizer:
    if model != "gpt2":
        raise UnsupportedTokenizer(
            f"GGUF tokenizer model '{model}' is not supported yet (only byte-level BPE, 'gpt2')"
        )
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    special = [
        AddedToken(tok, special=(typ == _CONTROL), normalized=False)
        for tok, typ in zip(tokens, token_types, strict=True)
        if typ in (_CONTROL, _USER_DEFINED)
    ]
    tk.add_special_tokens(special)
    return tk


def tokenizer_from_dir(path: Path) -> Tokenizer:
    file = path / "tokenizer.json"
    if not file.exists():
        raise UnsupportedTokenizer(f"{path} has no tokenizer.json")
    return Tokenizer.from_file(str(file))
