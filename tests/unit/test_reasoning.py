"""Reasoning split: ``<think>...</think>`` becomes ``reasoning_content``, whatever the detokenizer's
splits, and the answer is left exactly as the model wrote it when there is no reasoning."""

from __future__ import annotations

from typing import Any

import pytest

from llmd.text.reasoning import (
    ReasoningSplitter,
    prompt_opens_reasoning,
    reasoning_support,
    split_reasoning,
)

QWEN3_LIKE_TEMPLATE = (
    "{%- for message in messages %}{%- if message.role == 'assistant' %}"
    "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
R1_LIKE_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '<｜User｜>' + message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _pieces_every_way(text: str) -> list[list[str]]:
    """Every split into two pieces, plus one character at a time."""
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


def _stream(pieces: list[str], **kwargs: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter(**kwargs)
    reasoning, content = [], []
    for piece in pieces:
        out = splitter.feed(piece)
        reasoning.append(out.reasoning)
        content.append(out.content)
    last = splitter.flush()
    return "".join(reasoning) + last.reasoning, "".join(content) + last.content


CASES = [
    # (output, starts_in_reasoning, expected reasoning, expected content)
    (
        "<think>\nLet me add: 2+2.\n</think>\n\nThe answer is 4.",
        False,
        "Let me add: 2+2.",
        "The answer is 4.",
    ),
    ("Let me add.\n</think>\n\nIt is 4.", True, "Let me add.", "It is 4."),
    ("<think>\nTwice opened.\n</think>\n\nOK", True, "Twice opened.", "OK"),
    ("  Plain answer, <b>no</b> tags.\n", False, None, "  Plain answer, <b>no</b> tags.\n"),
    (
        "Use the <think> tag like </think> this.",
        False,
        None,
        "Use the <think> tag like </think> this.",
    ),
    (
        "<think>\nStill thinking when max_tokens hit",
        False,
        "Still thinking when max_tokens hit",
        "",
    ),
    ("Thinking without an end", True, "Thinking without an end", ""),
    ("<think>\n\n</think>\n\nHi", False, None, "Hi"),
    ("<think>a</think>b</think>c <think>d", False, "a", "b</think>c <think>d"),
    ("\n\n<think>x < y, so\n</think>Answer: y", False, "x < y, so", "Answer: y"),
    ("<", False, None, "<"),
    ("<thin", True, "<thin", ""),
    ("", False, None, ""),
]


@pytest.mark.parametrize(("output", "starts_in", "reasoning", "content"), CASES)
def test_split_matches_expected_and_streaming_at_every_split(
    output: str, starts_in: bool, reasoning: str | None, content: str
) -> None:
    assert split_reasoning(output, starts_in_reasoning=starts_in) == (reasoning, content)
    for pieces in _pieces_every_way(output):
        got = _stream(pieces, starts_in_reasoning=starts_in)
        assert got == (reasoning or "", content), pieces


def test_reasoning_streams_without_waiting_for_the_close_tag() -> None:
    splitter = ReasoningSplitter()
    first = splitter.feed("<think>\nFirst idea")
    assert (first.reasoning, first.content) == ("First idea", "")
    # Only a possible "</think>" and trailing whitespace wait for the next piece.
    second = splitter.feed(", second idea\n</th")
    assert (second.reasoning, second.content) == (", second idea", "")
    third = splitter.feed("ink>\n\nThe answer")
    assert (third.reasoning, third.content) == ("", "The answer")
    assert not splitter.flush()


def test_a_plain_answer_streams_at_once() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("Hello").content == "Hello"
    assert splitter.feed(" there").content == " there"
    assert not splitter.saw_reasoning


def test_keep_inline_passes_everything_through_as_content() -> None:
    out = _stream(["<think>\nhm", "m\n</think>\n\nHi"], keep_inline=True)
    assert out == ("", "<think>\nhmm\n</think>\n\nHi")
    # The prompt opened the block: the client still sees a balanced one.
    out = _stream(["hmm\n</think>", "\n\nHi"], keep_inline=True, starts_in_reasoning=True)
    assert out == ("", "<think>\nhmm\n</think>\n\nHi")


def test_prompt_opens_reasoning_from_the_rendered_prompt() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert prompt_opens_reasoning("<｜Assistant｜><think>")
    # Qwen3 with enable_thinking=False closes an empty block in the prompt.
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def test_reasoning_support_from_templates_and_families() -> None:
    qwen3 = reasoning_support(QWEN3_LIKE_TEMPLATE, "qwen3")
    assert (qwen3.is_reasoning_model, qwen3.template_opens_think) == (True, False)
    r1 = reasoning_support(R1_LIKE_TEMPLATE, None)
    assert (r1.is_reasoning_model, r1.template_opens_think) == (True, True)
    smol = reasoning_support(SMOLLM2_TEMPLATE, "llama")
    assert (smol.is_reasoning_model, smol.template_opens_think) == (False, False)
    by_family = reasoning_support(None, "deepseek-r1-distill-qwen")
    assert (by_family.is_reasoning_model, by_family.template_opens_think) == (True, False)
    broken = reasoning_support("{{ raise_exception('no') }}</think>", None)
    assert (broken.is_reasoning_model, broken.template_opens_think) == (True, False)


def test_the_real_test_models_template_is_not_a_reasoning_one(text_model: Any) -> None:
    support = reasoning_support(text_model.chat_template, "llama")
    assert not support.is_reasoning_model and not support.template_opens_think
