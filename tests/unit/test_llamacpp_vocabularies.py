"""llmd's GGUF tokenizers against llama.cpp's own tokenizer test data.

llama.cpp ships vocabulary-only GGUF files of many model families with test texts and the ids
its tokenizer must produce for them (`models/ggml-vocab-<name>.gguf{,.inp,.out}`: the `.out`
ids come from each model's original Hugging Face tokenizer, and llama.cpp's test-tokenizer-0
checks its own tokenizer against them). Nothing of it is committed here: the files are read
from the llama.cpp sources inside the llama-cpp-python source distribution on PyPI (the same
one bench/build_llamacpp.sh builds llama.cpp from), downloaded once into a cache directory.

Every vocabulary whose tokenizer llmd claims to rebuild must give exactly those ids and decode
back to the text; the others must be refused by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from llmd.store.gguf_metadata import read_gguf_metadata
from llmd.store.model_support import gguf_tokenizer_problem
from llmd.text.chat_template import render_chat
from llmd.text.text_model import load_gguf_text_model
from llmd.text.tokenizer import UnsupportedTokenizer, tokenizer_from_gguf

VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
ROOT = Path(__file__).parents[2]
SEPARATOR = "\n__ggml_vocab_test__\n"

# Vocabularies llmd rebuilds (model family: tokenizer model / pre-tokenizer).
SUPPORTED = [
    "llama-spm",  # SentencePiece: Llama 2, Mistral, Gemma 1-3 ("llama")
    "gemma-4",  # Gemma 4 ("gemma4": BPE over raw UTF-8)
    "llama-bpe",  # Llama 3 (byte-level BPE, ignore_merges)
    "qwen2",
    "qwen35",
    "gpt-2",
    "starcoder",
    "refact",
    "command-r",
    "mpt",
    "phi-3",  # SentencePiece without the space prefix quirks of Llama 2
]
# Refused, with the reason naming what is missing.
REFUSED = {"deepseek-llm": "'deepseek-llm'", "falcon": "'falcon'"}
# WordPiece vocabularies (encoders: wpm_tokenizer.py): ids only, embeddings decode nothing.
WORDPIECE = ["bert-bge"]


def _candidates() -> list[Path]:
    sources = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models"
    return [ROOT / "bench" / ".llamacpp" / sources, _cache_dir() / sources]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmd-tests"


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    for d in _candidates():
        if (d / "ggml-vocab-llama-spm.gguf").exists():
            return d
    target = _cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            + [f"llama-cpp-python=={VERSION}", "-d", tmp],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if got.returncode != 0:
            pytest.skip(f"llama-cpp-python {VERSION} sdist not downloadable: {got.stderr[-300:]}")
        wanted = {
            f"ggml-vocab-{name}.gguf{ext}"
            for name in [*SUPPORTED, *REFUSED, *WORDPIECE]
            for ext in ("", ".inp", ".out")
        }
        with tarfile.open(next(Path(tmp).glob("*.tar.gz")), "r|gz") as sdist:
            for member in sdist:
                if "/models/" in member.name and Path(member.name).name in wanted:
                    sdist.extract(member, target, filter="data")
    return _candidates()[1]


def _cases(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    texts = (vocab_dir / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    inputs = texts.split(SEPARATOR)
    if texts.endswith(SEPARATOR):  # the separator ends each text, as llama.cpp reads them
        inputs.pop()
    outputs = (vocab_dir / f"ggml-vocab-{name}.gguf.out").read_text().splitlines()
    assert len(inputs) == len(outputs)
    return [
        (text, [int(t) for t in ids.split()]) for text, ids in zip(inputs, outputs, strict=True)
    ]


@pytest.mark.parametrize("name", SUPPORTED)
def test_gguf_tokenizer_gives_llamacpps_ids(vocab_dir: Path, name: str) -> None:
    meta = read_gguf_metadata(vocab_dir / f"ggml-vocab-{name}.gguf")
    tokenizer = tokenizer_from_gguf(meta)
    cases = _cases(vocab_dir, name)
    wrong = [
        (text, ids, got)
        for text, ids in cases
        if (got := tokenizer.encode(text, add_special_tokens=False).ids) != ids
    ]
    assert not wrong, f"{len(wrong)}/{len(cases)} texts tokenized differently: {wrong[:3]}"
    # Decoding gives the text back (what a streamed answer shows), apart from the space a
    # SentencePiece prefix adds and the decoder removes again.
    for text, ids in cases:
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("name", WORDPIECE)
def test_wordpiece_tokenizer_gives_llamacpps_ids(vocab_dir: Path, name: str) -> None:
    tokenizer = tokenizer_from_gguf(read_gguf_metadata(vocab_dir / f"ggml-vocab-{name}.gguf"))
    cases = _cases(vocab_dir, name)
    wrong = [
        (text, ids, got)
        for text, ids in cases
        if (got := tokenizer.encode(text, add_special_tokens=False).ids) != ids
    ]
    assert not wrong, f"{len(wrong)}/{len(cases)} texts tokenized differently: {wrong[:3]}"


@pytest.mark.parametrize(("name", "reason"), REFUSED.items())
def test_tokenizers_llmd_cannot_rebuild_are_refused_by_name(
    vocab_dir: Path, name: str, reason: str
) -> None:
    meta = read_gguf_metadata(vocab_dir / f"ggml-vocab-{name}.gguf")
    problem = gguf_tokenizer_problem(
        meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    )
    assert problem and reason in problem
    with pytest.raises(UnsupportedTokenizer, match=reason):
        tokenizer_from_gguf(meta)


def test_special_tokens_of_a_rendered_template_are_single_ids(vocab_dir: Path) -> None:
    """A Gemma-style turn rendered by a chat template keeps its control tokens whole, and a
    SentencePiece vocabulary with a space prefix starts each text run after them with "▁"."""
    meta = read_gguf_metadata(vocab_dir / "ggml-vocab-llama-spm.gguf")
    tokenizer = tokenizer_from_gguf(meta)
    ids = tokenizer.encode("<s>Hello</s>Hello", add_special_tokens=False).ids
    hello = tokenizer.encode("Hello", add_special_tokens=False).ids
    assert ids == [1, *hello, 2, *hello]
    assert tokenizer.id_to_token(hello[0]).startswith("\u2581")


def test_gemma4_chat_prompt_has_one_bos_and_its_turn_end_stops(vocab_dir: Path) -> None:
    """Gemma's template writes `<bos>` itself and the GGUF asks for a BOS too: the prompt must
    start with exactly one (the double-BOS regression the Gemma seed fixed), every control
    token of the rendered turn must be one id, and the end of a turn must stop generation."""
    text = load_gguf_text_model(vocab_dir / "ggml-vocab-gemma-4.gguf")
    assert text.add_bos and text.chat_template
    rendered = render_chat(
        text.chat_template,
        [{"role": "user", "content": "Hi there"}],
        bos_token=text.bos_token,
        eos_token=text.eos_token,
    )
    ids = text.encode_rendered_chat(rendered)
    assert rendered.startswith(text.bos_token)
    assert ids[0] == text.bos_id and ids.count(text.bos_id) == 1
    assert text.tokenizer.decode(ids, skip_special_tokens=False) == rendered
    turn_end = text.tokenizer.token_to_id("<turn|>")
    assert turn_end is not None and turn_end in text.stop_token_ids
