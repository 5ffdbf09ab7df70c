"""Incremental detokenization with the default model's real tokenizer: streamed deltas never
carry half a UTF-8 character and always add up to the full decode."""

from __future__ import annotations

import pytest

from llmd.text.detokenizer import IncrementalDetokenizer
from llmd.text.text_model import TextModel

TEXTS = [
    "请用中文介绍一下长城。",
    "Emoji: 🌞🏖️🌊🍦 and 👩‍👩‍👧",
    "naïve façade, Ελληνικά, русский, 𝄞 music",
    "def f(x):\n    return x ** 2  # plain ASCII",
]


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_never_splits_a_character(text_model: TextModel, text: str) -> None:
    ids = text_model.encode(text)
    detok = IncrementalDetokenizer(text_model.tokenizer)
    deltas = [detok.add([t]) for t in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_hidden_tokens_never_reach_the_text(text_model: TextModel) -> None:
    im_end = text_model.tokenizer.token_to_id("<|im_end|>")
    ids = text_model.encode("Paris.") + [im_end]
    detok = IncrementalDetokenizer(text_model.tokenizer, skip_ids={im_end})
    assert "".join(detok.add([t]) for t in ids) + detok.flush() == "Paris."


def test_character_cut_off_at_the_end_is_dropped_not_garbled(text_model: TextModel) -> None:
    ids = text_model.encode("ok 𝄞")  # 𝄞 is four byte tokens here
    assert len(ids) > 3
    detok = IncrementalDetokenizer(text_model.tokenizer)
    text = "".join(detok.add([t]) for t in ids[:-1]) + detok.flush()  # last byte never came
    assert text == "ok "
