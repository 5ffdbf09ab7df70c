"""The prompt a model sees: its own chat template, rendered in a sandbox as Hugging Face
renders it, tokenized exactly as llama.cpp tokenizes it (tests/fixtures, recorded with
llama.cpp), ending generation on the same tokens llama.cpp does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmd.errors import ApiError
from llmd.store.gguf_metadata import GGUFMetadataError, read_gguf_metadata
from llmd.text.chat_template import render_chat
from llmd.text.text_model import TextModel
from llmd.text.tokenizer import UnsupportedTokenizer, tokenizer_from_gguf

REFERENCE = Path(__file__).parents[1] / "fixtures" / "llamacpp_reference.json"


def _reference_cases() -> list[dict]:
    if not REFERENCE.exists():
        return []
    return json.loads(REFERENCE.read_text())["cases"]


@pytest.mark.skipif(not REFERENCE.exists(), reason="llama.cpp fixtures not recorded yet")
@pytest.mark.parametrize("case", _reference_cases(), ids=lambda c: c["name"])
def test_rendered_prompt_and_ids_match_llamacpp(text_model: TextModel, case: dict) -> None:
    assert text_model.chat_template is not None
    rendered = render_chat(
        text_model.chat_template,
        case["messages"],
        bos_token=text_model.bos_token,
        eos_token=text_model.eos_token,
    )
    assert rendered == case["rendered_prompt"]
    assert text_model.encode_rendered_chat(rendered) == case["prompt_ids"]


def test_default_model_facts_from_gguf(text_model: TextModel) -> None:
    assert text_model.context_length == 8192
    assert text_model.add_bos is False and text_model.bos_id == 1
    # eos <|im_end|> and <|endoftext|>: llama.cpp's end-of-generation set for this vocab
    assert text_model.stop_token_ids == [2, 0]
    assert {0, 1, 2} <= text_model.special_ids
    # control tokens are single tokens inside text, as llama-server tokenizes templates
    assert text_model.encode("<|im_start|>user") == [1, 4093]


def test_metadata_reader_agrees_with_the_gguf_package(model_path: Path) -> None:
    from gguf import GGUFReader

    ours = read_gguf_metadata(model_path)
    reference = GGUFReader(str(model_path))
    for key, field in reference.fields.items():
        if key.startswith("GGUF.") and key != "GGUF.version":
            continue
        value = field.contents()
        if isinstance(value, float):
            assert ours[key] == pytest.approx(value), key
        else:
            assert ours[key] == value, key


def test_metadata_reader_refuses_a_non_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(GGUFMetadataError, match="not a GGUF file"):
        read_gguf_metadata(bad)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(model_head(n_kv=3))
    with pytest.raises(GGUFMetadataError, match="truncated"):
        read_gguf_metadata(truncated)


def model_head(n_kv: int) -> bytes:
    import struct

    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv)


def test_unknown_pre_tokenizer_is_refused_not_approximated() -> None:
    with pytest.raises(UnsupportedTokenizer, match="'default'"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(UnsupportedTokenizer, match="'t5'"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(UnsupportedTokenizer, match=r"no \[CLS\] token"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


def test_template_raise_exception_is_a_400_on_messages() -> None:
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    with pytest.raises(ApiError) as info:
        render_chat(template, [{"role": "assistant", "content": "x"}], bos_token="", eos_token="")
    assert info.value.status == 400 and info.value.param == "messages"
    assert "user first" in info.value.message


def test_template_sandbox_blocks_python_internals() -> None:
    template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ApiError) as info:
        render_chat(template, [{"role": "user", "content": "x"}], bos_token="", eos_token="")
    assert info.value.status == 400


def test_template_sandbox_is_immutable() -> None:
    template = "{% set _ = messages.append({'role': 'user'}) %}{{ messages|length }}"
    with pytest.raises(ApiError):
        render_chat(template, [{"role": "user", "content": "x"}], bos_token="", eos_token="")


def test_template_helpers_as_transformers_provides_them() -> None:
    template = (
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{% if loop.first %}{% break %}{% endif %}{% endfor %}|{{ tools|tojson }}|"
        "{{ {'é': 1}|tojson }}|{{ strftime_now('%Y') | length }}"
    )
    out = render_chat(
        template,
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        bos_token="",
        eos_token="",
        tools=None,
    )
    assert out == 'a|null|{"é": 1}|4'


def test_hf_directory_brings_its_tokenizer_template_and_stops(
    text_model: TextModel, tmp_path: Path
) -> None:
    text_model.tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(
        json.dumps({"max_position_embeddings": 2048, "eos_token_id": [2, 0], "bos_token_id": 1})
    )
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": template,
                "eos_token": "<|im_end|>",
                "bos_token": {"content": "<|im_start|>"},
                "added_tokens_decoder": {"2": {"content": "<|im_end|>", "special": True}},
            }
        )
    )
    from llmd.text.text_model import load_text_model

    hf = load_text_model(tmp_path)
    assert hf.chat_template == template and hf.context_length == 2048
    assert hf.stop_token_ids == [2, 0] and 2 in hf.special_ids
    assert hf.eos_token == "<|im_end|>" and hf.bos_id == 1
    assert hf.encode("Hello 长城") == text_model.encode("Hello 长城")
