"""Gemma 4's thinking channel (``<|channel>thought ... <channel|>``) split into
``reasoning_content`` by the same rules as ``<think>``: markers chosen from the template, kept
visible to the splitter although they are control tokens, the thinking switch passed from
``reasoning_effort``, and a forced tool call allowed after the thought."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmd.errors import ApiError
from llmd.text.chat_output import ChatOutputPlan
from llmd.text.chat_pipeline import chat_prompt
from llmd.text.chat_template import render_chat
from llmd.text.openai_schemas import ChatCompletionRequest
from llmd.text.reasoning import (
    GEMMA4_THOUGHT,
    THINK,
    ReasoningSplitter,
    prompt_closes_reasoning,
    reasoning_markers,
    reasoning_support,
    split_reasoning,
    thinking_switch,
)
from llmd.text.tools import tool_call_grammar

# A minimal Gemma 4-style template (written for these tests): `<|think|>` in the system turn
# when thinking is on; otherwise the generation prompt closes an empty thought channel.
GEMMA4_STYLE_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if enable_thinking is defined and enable_thinking %}"
    "{{- '<|turn>system\\n<|think|>\\n<turn|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message.role == 'assistant' else message.role %}"
    "{%- set text = message.content %}"
    "{%- if role == 'model' and '<channel|>' in text %}"
    "{%- set text = text.split('<channel|>')[-1] %}{%- endif %}"
    "{{- '<|turn>' + role + '\\n' + text | trim + '<turn|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|turn>model\\n' }}"
    "{%- if not enable_thinking | default(false) %}{{- '<|channel>thought\\n<channel|>' }}"
    "{%- endif %}{%- endif %}"
)
QWEN3_STYLE_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
R1_STYLE_TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<think>\\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ANSWER = "<|channel>thought\nThe user greets me.\nBe brief.<channel|>Hello! How can I help?"


def _render(template: str, **extra: Any) -> str:
    return render_chat(
        template, [{"role": "user", "content": "Hi"}], bos_token="<bos>", eos_token="", **extra
    )


def _stream(pieces: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter(open_tag=GEMMA4_THOUGHT.open, close_tag=GEMMA4_THOUGHT.close)
    parts = [splitter.feed(p) for p in pieces] + [splitter.flush()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


def test_the_markers_come_from_the_template() -> None:
    assert reasoning_markers(GEMMA4_STYLE_TEMPLATE) == GEMMA4_THOUGHT
    assert reasoning_markers(QWEN3_STYLE_TEMPLATE) == THINK
    assert reasoning_markers(None) == THINK
    gemma = reasoning_support(GEMMA4_STYLE_TEMPLATE)
    assert gemma.is_reasoning_model and gemma.markers == GEMMA4_THOUGHT
    assert gemma.thinking_switch and not gemma.template_opens_think
    assert reasoning_support(QWEN3_STYLE_TEMPLATE).markers == THINK
    assert not reasoning_support(CHATML_TEMPLATE).is_reasoning_model


def test_the_thought_channel_becomes_reasoning_content() -> None:
    assert split_reasoning(ANSWER, markers=GEMMA4_THOUGHT) == (
        "The user greets me.\nBe brief.",
        "Hello! How can I help?",
    )
    # The same text read with Qwen's markers is all answer: the families do not mix.
    assert split_reasoning(ANSWER) == (None, ANSWER)


def test_streamed_at_every_split_equals_the_whole_split() -> None:
    whole = ("The user greets me.\nBe brief.", "Hello! How can I help?")
    for i in range(len(ANSWER) + 1):
        assert _stream([ANSWER[:i], ANSWER[i:]]) == whole, i
    assert _stream(list(ANSWER)) == whole


def test_same_rules_as_think() -> None:
    # Only at the start: a channel marker later in the answer is quoted text.
    later = "Gemma writes <|channel>thought\nlike this<channel|> when it thinks."
    assert split_reasoning(later, markers=GEMMA4_THOUGHT) == (None, later)
    # Unterminated (out of tokens while thinking): everything is reasoning, no answer.
    cut = "<|channel>thought\nStill thinking about"
    assert split_reasoning(cut, markers=GEMMA4_THOUGHT) == ("Still thinking about", "")
    for i in range(len(cut) + 1):
        assert _stream([cut[:i], cut[i:]]) == ("Still thinking about", ""), i
    # No marker: the answer untouched, leading whitespace included.
    assert split_reasoning("  Hi.", markers=GEMMA4_THOUGHT) == (None, "  Hi.")


def test_the_chat_output_splits_gemma4_answers_whole_and_streamed() -> None:
    plan = ChatOutputPlan(split_reasoning=True, reasoning_markers=GEMMA4_THOUGHT)
    message, _ = plan.whole(ANSWER, "stop")
    assert message["reasoning_content"] == "The user greets me.\nBe brief."
    assert message["content"] == "Hello! How can I help?"
    stream = plan.stream()
    deltas = [d for ch in ANSWER for d in stream.feed(ch)] + stream.finish("stop")[0]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]


def test_reasoning_effort_flips_the_template_switch() -> None:
    gemma = reasoning_support(GEMMA4_STYLE_TEMPLATE)
    assert thinking_switch(None, gemma) == {}  # the template's default (off for Gemma 4)
    assert thinking_switch("none", gemma) == {"enable_thinking": False}
    assert thinking_switch("low", gemma) == {"enable_thinking": True}
    on = _render(GEMMA4_STYLE_TEMPLATE, **thinking_switch("high", gemma))
    assert "<|think|>" in on and not prompt_closes_reasoning(on, GEMMA4_THOUGHT.close)
    off = _render(GEMMA4_STYLE_TEMPLATE)
    assert "<|think|>" not in off and prompt_closes_reasoning(off, GEMMA4_THOUGHT.close)
    qwen = reasoning_support(QWEN3_STYLE_TEMPLATE)
    assert qwen.thinking_switch
    assert prompt_closes_reasoning(_render(QWEN3_STYLE_TEMPLATE, **thinking_switch("none", qwen)))


def test_reasoning_effort_a_template_cannot_honour_is_a_400() -> None:
    with pytest.raises(ApiError) as err:
        thinking_switch("none", reasoning_support(R1_STYLE_TEMPLATE))  # always thinks
    assert err.value.param == "reasoning_effort"
    assert thinking_switch("medium", reasoning_support(R1_STYLE_TEMPLATE)) == {}
    with pytest.raises(ApiError):
        thinking_switch("high", reasoning_support(CHATML_TEMPLATE))  # never thinks
    assert thinking_switch("none", reasoning_support(CHATML_TEMPLATE)) == {}


def test_a_forced_call_may_follow_the_thought_channel() -> None:
    tools = [{"type": "function", "function": {"name": "now"}}]
    grammar = tool_call_grammar(
        tools,
        "required",
        "gemma4",
        special_tokens={"<|channel>": 100, "<channel|>": 101, "<|tool_call>": 48},
        reasoning="optional",
        reasoning_markers=(GEMMA4_THOUGHT.open, GEMMA4_THOUGHT.close),
    )
    assert grammar is not None
    assert '(<[100]> "thought" think_text' in grammar  # the channel opens as its token
    assert "think_text: /(.|\\n)*/ <[101]>" in grammar
    assert "<think>" not in grammar


# -- with the real Gemma 4 vocabulary and template (llama.cpp's vocab-only GGUF) ----------

GEMMA4_VOCAB = (
    Path(__file__).parents[2]
    / "bench/.llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf"
)


@pytest.fixture(scope="module")
def gemma4_text() -> Any:
    if not GEMMA4_VOCAB.exists():
        pytest.skip("llama.cpp's Gemma 4 vocabulary is not on disk")
    from llmd.text.text_model import load_gguf_text_model

    text = load_gguf_text_model(GEMMA4_VOCAB)
    # Hugging Face's tokenizer.json marks the channel markers special: hide them as a
    # safetensors model would, so the test shows they are let through.
    for marker in GEMMA4_THOUGHT.tokens:
        text.special_ids.add(text.tokenizer.token_to_id(marker))
    return text


def _prompt(text: Any, **body: Any) -> Any:
    req = ChatCompletionRequest.model_validate(
        {"model": "gemma4", "messages": [{"role": "user", "content": "Hi"}], **body}
    )
    return chat_prompt(req, SimpleNamespace(text=text, context_length=text.context_length))  # type: ignore[arg-type]


def test_real_gemma4_template_thinks_only_when_asked(gemma4_text: Any) -> None:
    support = reasoning_support(gemma4_text.chat_template)
    assert support.markers == GEMMA4_THOUGHT and support.thinking_switch
    channel = {gemma4_text.tokenizer.token_to_id(m) for m in GEMMA4_THOUGHT.tokens}
    thinking = _prompt(gemma4_text, reasoning_effort="high")
    assert thinking.output.reasoning_markers == GEMMA4_THOUGHT
    assert channel <= thinking.show_tokens  # the splitter sees the markers
    think_id = gemma4_text.tokenizer.token_to_id("<|think|>")
    assert think_id in thinking.ids
    plain = _prompt(gemma4_text)  # the template's default: the prompt closes an empty thought
    assert think_id not in plain.ids
    assert not channel & plain.show_tokens
