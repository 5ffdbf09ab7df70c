"""The WordPiece tokenizer llmd rebuilds from an encoder GGUF (wpm_tokenizer.py) gives the ids
the model's own tokenizer.json gives, on the tiny encoder models' vocabulary written as
llama.cpp's converter writes it (word starts marked with U+2581, "##" dropped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llmd.store.gguf_metadata import read_gguf_metadata
from llmd.text.tokenizer import tokenizer_from_gguf
from tests.native.tiny_encoder_models import write_encoder_dir, write_encoder_gguf

pytest.importorskip("gguf")

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "encoder_embeddings_reference.json").read_text()
)


@pytest.mark.parametrize("arch", ["bert", "nomic_bert"])
def test_gguf_wordpiece_matches_the_directory_tokenizer(tmp_path: Path, arch: str) -> None:
    write_encoder_dir(tmp_path / "dir", arch)
    write_encoder_gguf(tmp_path / "m.gguf", arch)
    ours = tokenizer_from_gguf(read_gguf_metadata(tmp_path / "m.gguf"))
    theirs = Tokenizer.from_file(str(tmp_path / "dir" / "tokenizer.json"))
    texts = [item["text"] for item in FIXTURE[arch]["items"]] + ["W7ING w5s. [CLS] x", "w5\tw6\nw7"]
    for text in texts:
        assert ours.encode(text).ids == theirs.encode(text).ids, text
    assert [item["ids"] for item in FIXTURE[arch]["items"]] == [
        ours.encode(item["text"]).ids for item in FIXTURE[arch]["items"]
    ]
