"""XLM-RoBERTa GGUF files (``tokenizer.ggml.model`` "t5": BGE-M3, multilingual-e5,
bge-reranker-v2-m3) as llama.cpp's converter writes them: llmd rebuilds their SentencePiece
unigram vocabulary into the tokenizer transformers uses, and knows at pull time that one
embeds and the other reranks. The files are tiny XLM-R models converted by llama.cpp's
convert_hf_to_gguf.py from a real SentencePiece unigram model, and the reference ids are
transformers' (checked against SentencePiece itself when recorded:
tests/fixtures/record_xlmr_gguf.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmd.store.gguf_layout import read_layout
from llmd.store.gguf_metadata import read_gguf_metadata
from llmd.store.install import check_gguf, gguf_kind
from llmd.store.model_kind import ModelKind
from llmd.text.tokenizer import UnsupportedTokenizer, tokenizer_from_gguf

FIXTURES = Path(__file__).parents[1] / "fixtures"
REFERENCE = json.loads((FIXTURES / "xlmr_gguf_reference.json").read_text())
EMBED = FIXTURES / "xlmr_unigram_embed.gguf"
RERANK = FIXTURES / "xlmr_unigram_rerank.gguf"
SINGLE = REFERENCE["embed"]["items"] + REFERENCE["tokenize"]


@pytest.fixture(scope="module")
def meta() -> dict:
    return read_gguf_metadata(EMBED)


@pytest.mark.parametrize("item", SINGLE, ids=[repr(i["text"])[:24] for i in SINGLE])
def test_ids_are_transformers_ids(meta: dict, item: dict) -> None:
    """Accents, CJK, emoji, whitespace runs and tabs, full-width forms, characters outside the
    vocabulary, special tokens written in the text: the same ids as XLM-R's own tokenizer."""
    assert tokenizer_from_gguf(meta).encode(item["text"]).ids == item["ids"]


def test_pairs_are_joined_as_xlm_roberta_joins_them() -> None:
    """The cross-encoder's (query, document) input: <s> query </s></s> document </s>."""
    tk = tokenizer_from_gguf(read_gguf_metadata(RERANK))
    query = REFERENCE["rerank"]["query"]
    for item in REFERENCE["rerank"]["items"]:
        assert tk.encode(query, item["document"]).ids == item["ids"]
    assert tk.num_special_tokens_to_add(is_pair=True) == 4


def test_the_masks_filler_is_mask_again_and_no_filler_is_ever_produced(meta: dict) -> None:
    """The converter writes "[PADn]" (type unused, score -10000) where XLM-R has <mask>; that
    id is <mask> again, and the filler's name in a text is ordinary text."""
    tk = tokenizer_from_gguf(meta)
    mask = meta["tokenizer.ggml.mask_token_id"]
    assert meta["tokenizer.ggml.tokens"][mask].startswith("[PAD")
    assert tk.encode("<mask>", add_special_tokens=False).ids == [mask]
    filler = meta["tokenizer.ggml.tokens"][mask]
    assert mask not in tk.encode(filler).ids


def test_whitespace_runs_are_dropped_whatever_the_converter_wrote(meta: dict) -> None:
    """A file converted from tokenizer.json alone carries transformers'
    clean_up_tokenization_spaces as remove_extra_whitespaces (often false); XLM-R's tokenizer
    drops whitespace runs all the same."""
    item = next(i for i in SINGLE if i["text"].startswith("  leading"))
    kept = {**meta, "tokenizer.ggml.remove_extra_whitespaces": False}
    assert tokenizer_from_gguf(kept).encode(item["text"]).ids == item["ids"]


def test_files_it_cannot_rebuild_are_refused(meta: dict) -> None:
    for change, reason in (
        ({"tokenizer.ggml.scores": None}, "no score for every piece"),
        ({"general.architecture": "t5"}, "XLM-RoBERTa encoders .* only"),
    ):
        with pytest.raises(UnsupportedTokenizer, match=reason):
            tokenizer_from_gguf({**meta, **change})


def test_pull_knows_the_embedder_from_the_reranker() -> None:
    """The embedding file says CLS pooling (from its sentence-transformers config); the
    reranker file has no pooling_type at all, only the classifier head (cls.output), which
    makes it a cross-encoder."""
    for path, kind in (
        (EMBED, ModelKind("embed", "cls", True)),
        (RERANK, ModelKind("rerank", "cls")),
    ):
        layout = read_layout(path)
        assert not check_gguf(layout, path.name).needed
        assert gguf_kind(layout, path.name) == kind
    assert "bert.pooling_type" not in read_gguf_metadata(RERANK)
