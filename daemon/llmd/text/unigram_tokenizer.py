"""The SentencePiece *unigram* vocabulary of an XLM-RoBERTa GGUF (``tokenizer.ggml.model``
"t5": BGE-M3, multilingual-e5, bge-reranker-v2-m3), rebuilt with Hugging Face `tokenizers`.

llama.cpp's converter writes XLM-R's SentencePiece model as it is: every piece with its score
and type, SentencePiece's normalization table (``precompiled_charsmap``, nmt_nfkc for XLM-R),
``add_space_prefix`` and ``remove_extra_whitespaces``; ids already follow XLM-R's (fairseq's)
numbering, <s> <pad> </s> <unk> first. Rebuilt the way transformers builds XLM-R's own
tokenizer: the table normalizes, whitespace runs are dropped (SentencePiece's
remove_extra_whitespaces), each word gets a leading "▁" (Metaspace), the unigram model picks
the most likely segmentation (Viterbi over the scores; characters no piece covers become
<unk>), and an input is wrapped as ``<s> A </s>`` (a pair: ``<s> A </s></s> B </s>``, as the
cross-encoders read query and document). Checked id for id against transformers' tokenizer and
SentencePiece itself on a real unigram vocabulary (tests/fixtures/record_xlmr_gguf.py,
tests/unit/test_unigram_tokenizer.py).

Two details of the file differ from the original tokenizer and are undone here:

- The converter has no piece for XLM-R's <mask> (SentencePiece's model lacks it) and writes a
  "[PADn]" filler of type "unused" with score -10000 at its id; ``tokenizer.ggml.mask_token_id``
  names that id, so it becomes <mask> again.
- Other unused fillers (a checkpoint whose vocab_size exceeds the SentencePiece model) get a
  name that no text can produce and the score of a control token: left at -10000 they would
  lower the unigram model's lowest score, from which `tokenizers` derives the <unk> penalty,
  and so change how unknown characters are segmented.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from llmd.text.spm_tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

SPACE = "\u2581"


def _unused_name(token_id: int) -> str:
    # A space never reaches the model: the pre-tokenizer splits text there.
    return f"<unused {token_id}>"


def unigram_tokenizer(meta: Mapping[str, Any]) -> Tokenizer:
    """The XLM-R tokenizer of a "t5" GGUF's ``tokenizer.ggml.*`` metadata. ValueError for a
    file it cannot rebuild exactly (no scores, no <unk>).

    Whitespace runs are always dropped, whatever ``remove_extra_whitespaces`` says: XLM-R's
    SentencePiece model drops them, and so do transformers' tokenizers of it, but a file
    converted from a repository without ``sentencepiece.bpe.model`` carries transformers'
    ``clean_up_tokenization_spaces`` (a decoding option, often false) under that name."""
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ValueError("the GGUF's unigram vocabulary has no score for every piece")
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    if unk_id is None:
        unk_id = next((i for i, t in enumerate(types) if t == UNKNOWN), None)
    if unk_id is None or not 0 <= int(unk_id) < len(tokens):
        raise ValueError("the GGUF's unigram vocabulary has no <unk> piece")
    scores = [float(s) for s in scores]
    mask_id = meta.get("tokenizer.ggml.mask_token_id")
    for i, typ in enumerate(types):
        if typ != UNUSED:
            continue
        if i == mask_id:
            tokens[i], types[i] = "<mask>", CONTROL
        else:
            tokens[i] = _unused_name(i)
        scores[i] = 0.0
    tk = Tokenizer(
        models.Unigram(
            list(zip(tokens, scores, strict=True)),
            unk_id=int(unk_id),
            byte_fallback=any(t == BYTE for t in types),
        )
    )
    # The converter writes the table whenever the model has one (XLM-R's: nmt_nfkc); none
    # means SentencePiece's identity normalization.
    charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap:
        tk.normalizer = normalizers.Precompiled(bytes(charsmap))
    prepend = "always" if meta.get("tokenizer.ggml.add_space_prefix", True) else "never"
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=prepend),
        ]
    )
    tk.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme=prepend)
    tk.add_special_tokens(
        [
            AddedToken(tok, special=typ != USER_DEFINED, normalized=False)
            for tok, typ in zip(tokens, types, strict=True)
            if typ in (CONTROL, UNKNOWN, USER_DEFINED)
        ]
    )
    bos = int(meta.get("tokenizer.ggml.bos_token_id", 0))
    sep = int(
        meta.get("tokenizer.ggml.seperator_token_id", meta.get("tokenizer.ggml.eos_token_id", 2))
    )
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", True))
    cls_, sep_ = tokens[bos], tokens[sep]
    single = [cls_] * add_bos + ["$A"] + [sep_] * add_eos
    pair = [*single, *([sep_] * add_eos), "$B", *([sep_] * add_eos)]
    tk.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(cls_, bos), (sep_, sep)]
    )
    return tk
