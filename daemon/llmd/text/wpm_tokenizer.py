"""The WordPiece tokenizer of an encoder GGUF (``tokenizer.ggml.model`` "bert": BERT, BGE,
MiniLM, nomic-embed-text), rebuilt with Hugging Face `tokenizers` from the vocabulary
llama.cpp's converter wrote.

The converter rewrites the WordPiece vocabulary into a SentencePiece-looking one: a word-initial
piece gets a leading U+2581 ("▁"), a continuation piece loses its "##", and bracketed special
tokens ("[CLS]") stay as they are. Undoing that gives the original vocabulary back. As llama.cpp
tokenizes WPM, text is lowercased, accents are stripped, it is split on whitespace and
punctuation (CJK characters one by one), each word is matched longest-piece-first, a word with
no match becomes [UNK], and every input is wrapped in [CLS] ... [SEP]. Checked id for id
against llama.cpp's bert-bge test data (tests/unit/test_llamacpp_vocabularies.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

_WORD_START = "\u2581"


def _original_piece(token: str) -> str:
    if token.startswith(_WORD_START):
        return token[len(_WORD_START) :]
    if token.startswith("[") and token.endswith("]"):
        return token
    return "##" + token


def _special_id(meta: Mapping[str, Any], key: str, vocab: dict[str, int], name: str) -> int:
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is not None:
        return int(value)
    if name not in vocab:
        raise ValueError(f"the GGUF's WordPiece vocabulary has no {name} token")
    return vocab[name]


def wpm_tokenizer(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer llama.cpp builds from a "bert" GGUF's ``tokenizer.ggml.*`` metadata."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(_original_piece(token), i)
    unk = tokens[int(meta.get("tokenizer.ggml.unknown_token_id", vocab.get("[UNK]", 0)))]
    tk = Tokenizer(models.WordPiece(vocab, unk_token=_original_piece(unk)))
    tk.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # llama.cpp's converter writes [CLS] as the BOS token (older files: cls_token_id).
    cls_key = "bos_token_id" if "tokenizer.ggml.bos_token_id" in meta else "cls_token_id"
    cls = _special_id(meta, cls_key, vocab, "[CLS]")
    sep = _special_id(meta, "seperator_token_id", vocab, "[SEP]")  # llama.cpp's spelling
    specials = sorted({tokens[cls], tokens[sep]})
    tk.add_special_tokens(specials)
    tk.post_processor = processors.TemplateProcessing(
        single=f"{tokens[cls]} $A {tokens[sep]}",
        pair=f"{tokens[cls]} $A {tokens[sep]} $B:1 {tokens[sep]}:1",
        special_tokens=[(tokens[cls], cls), (tokens[sep], sep)],
    )
    return tk
