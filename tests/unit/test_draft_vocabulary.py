"""Whether a model may draft for another (speculative decoding): the same token at every id,
read from the files alone."""

from __future__ import annotations

import json
from pathlib import Path

from llmd.store.vocabulary import tokens_of, vocabulary_mismatch

from ..native.tiny_models import write_loadable_gguf


def test_the_same_vocabulary_may_draft_and_another_is_named(
    model_path: Path, tmp_path: Path
) -> None:
    assert vocabulary_mismatch(model_path, model_path) is None
    other = write_loadable_gguf(tmp_path / "tiny.gguf")
    problem = vocabulary_mismatch(model_path, other)
    assert problem is not None and "vocabularies differ" in problem
    assert str(len(tokens_of(model_path))) in problem


def test_one_token_that_differs_is_found_in_a_tokenizer_json(tmp_path: Path) -> None:
    def tree(name: str, vocab: dict[str, int]) -> Path:
        d = tmp_path / name
        d.mkdir()
        added = [{"id": 3, "content": "<eos>"}]
        (d / "tokenizer.json").write_text(
            json.dumps({"model": {"vocab": vocab}, "added_tokens": added})
        )
        return d

    a = tree("a", {"x": 0, "y": 1, "z": 2})
    b = tree("b", {"x": 0, "w": 1, "z": 2})
    assert tokens_of(a) == ["x", "y", "z", "<eos>"]
    assert vocabulary_mismatch(a, a) is None
    assert vocabulary_mismatch(a, b) == (
        "the vocabularies differ: token 1 is 'w' in the draft, 'y' in the model"
    )


def test_a_unigram_tokenizer_json_lists_its_pieces_in_id_order(tmp_path: Path) -> None:
    """SentencePiece Unigram models write `vocab` as [piece, score] pairs, not a mapping."""
    d = tmp_path / "unigram"
    d.mkdir()
    vocab = [["<unk>", 0.0], ["▁a", -1.5], ["b", -2.0]]
    (d / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "Unigram", "vocab": vocab}, "added_tokens": []})
    )
    assert tokens_of(d) == ["<unk>", "▁a", "b"]
