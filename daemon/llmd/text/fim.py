"""Fill-in-the-middle (FIM): finding a model's FIM tokens and building the prompt that asks it
for the text between a prefix and a suffix. One place for `/v1/completions` with `suffix`,
Ollama's `/api/generate` with `suffix` and llama-server's `/infill`.

Why token ids and not a text template: a code model was trained on its own FIM control tokens
(`<|fim_prefix|>` for Qwen2.5-Coder and CodeGemma, `<fim_prefix>` for StarCoder, `▁<PRE>`
for CodeLlama, ...), and the user's code must never be read as one of them (a file that
contains the text `<|endoftext|>` is code, not the end of the prompt). So the tokens are taken
from the model (GGUF metadata first, as llama.cpp does, else well-known vocabulary entries)
and the prefix, suffix and files are tokenized as plain text, then joined as ids.

Prompt (PSM order, llama-server's): ``[BOS] [repo header and files] <PRE> prefix prompt
<SUF> suffix <MID>``; the answer is the middle. The repo-level header (Qwen2.5-Coder's
``<|repo_name|>name`` and ``<|file_sep|>path`` per file) is used by `/infill` when the model
has those tokens; without a file separator, extra files are joined with a plain-text marker.

The generation stops at the model's end-of-text (already a stop token) and, as llama.cpp
treats them, at the FIM pad, repo and file-separator tokens: a model that finished the middle
often goes on with ``<|file_sep|>`` and the next file.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from llmd.errors import ApiError, bad_request
from llmd.store.gguf_metadata import read_gguf_metadata
from llmd.text.chat_output import ChatOutputPlan
from llmd.text.chat_pipeline import (
    ChatRun,
    RequestContext,
    choice_maker,
    encode_prompt,
    run_choices,
)

if TYPE_CHECKING:
    from llmd.runtime.supervisor import ModelSupervisor
    from llmd.text.openai_schemas import SamplingFields
    from llmd.text.text_model import TextModel

# GGUF metadata keys per role, newest first (llama.cpp's LLM_KV_TOKENIZER_FIM_* and the older
# prefix/suffix/middle ids some converters still write).
METADATA_KEYS: dict[str, tuple[str, ...]] = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "repo": ("tokenizer.ggml.fim_rep_token_id",),
    "file_sep": ("tokenizer.ggml.fim_sep_token_id",),
}
# Vocabulary entries per role, first match wins (the names llama.cpp detects, plus
# StarCoder2's `<repo_name>` / `<file_sep>` and CodeGemma's `<|file_separator|>`).
VOCABULARY_NAMES: dict[str, tuple[str, ...]] = {
    "prefix": (
        "<|fim_prefix|>",  # Qwen2.5-Coder, CodeGemma
        "<fim_prefix>",  # StarCoder, Granite
        "<fim-prefix>",
        "<｜fim▁begin｜>",  # DeepSeek-Coder
        "▁<PRE>",  # CodeLlama
        "<PRE>",
        "<|code_prefix|>",  # GLM-4.5
    ),
    "suffix": (
        "<|fim_suffix|>",
        "<fim_suffix>",
        "<fim-suffix>",
        "<｜fim▁hole｜>",
        "▁<SUF>",
        "<SUF>",
        "<|code_suffix|>",
    ),
    "middle": (
        "<|fim_middle|>",
        "<fim_middle>",
        "<fim-middle>",
        "<｜fim▁end｜>",
        "▁<MID>",
        "<MID>",
        "<|code_middle|>",
    ),
    "pad": ("<|fim_pad|>", "<fim_pad>", "<fim-pad>", "<PAD>"),
    "repo": ("<|repo_name|>", "<|fim_repo|>", "<repo_name>", "<fim-repo>", "<REPO>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<file_sep>", "<|file_separator|>"),
}
# What llama-server writes in the repo-level header (it has no project or file names).
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
DEFAULT_EXTRA_NAME = "tmp"
# Between extra files when the model has no file separator token (llama-server's marker).
SNIPPET_MARKER = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    """A model's FIM token ids: the three that make a FIM prompt, and the optional ones
    (pad, repo name, file separator) that also end a generated middle."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo: int | None = None
    file_sep: int | None = None

    def end_tokens(self) -> tuple[int, ...]:
        """Tokens after which a middle is complete (llama.cpp adds these to its EOG set)."""
        return tuple(t for t in (self.pad, self.repo, self.file_sep) if t is not None)


def find_fim_tokens(
    token_to_id: Callable[[str], int | None],
    vocab_size: int,
    metadata: Mapping[str, Any] | None = None,
) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks any of prefix, suffix and middle.
    A metadata id wins over a vocabulary name (ids outside the vocabulary, such as -1, are
    ignored, as llama.cpp ignores them)."""
    found: dict[str, int | None] = {}
    for role, keys in METADATA_KEYS.items():
        tid = None
        for key in keys:
            value = (metadata or {}).get(key)
            if isinstance(value, int) and 0 <= value < vocab_size:
                tid = value
                break
        if tid is None:
            for name in VOCABULARY_NAMES[role]:
                tid = token_to_id(name)
                if tid is not None:
                    break
        found[role] = tid
    prefix, suffix, middle = found["prefix"], found["suffix"], found["middle"]
    if prefix is None or suffix is None or middle is None:
        return None
    return FimTokens(prefix, suffix, middle, found["pad"], found["repo"], found["file_sep"])


@lru_cache(maxsize=32)
def _gguf_fim_metadata(path: str) -> dict[str, Any]:
    """Only the FIM keys of a GGUF's metadata (read once per file; blobs never change)."""
    meta = read_gguf_metadata(path)
    return {k: meta[k] for keys in METADATA_KEYS.values() for k in keys if k in meta}


def model_fim_tokens(model: ModelSupervisor) -> FimTokens | None:
    """The served model's FIM tokens (GGUF metadata, then its vocabulary)."""
    text = model.text
    meta = _gguf_fim_metadata(model.record.path) if model.record.format == "gguf" else None
    vocab = text.tokenizer.get_vocab_size(with_added_tokens=True)
    return find_fim_tokens(text.tokenizer.token_to_id, vocab, meta)


def no_fim_error(model_name: str, param: str) -> ApiError:
    return bad_request(
        f"'{param}' asks for fill-in-the-middle, but model '{model_name}' has no "
        "fill-in-the-middle tokens (it does not support insert); use a code model that has "
        "them, such as Qwen2.5-Coder, StarCoder2 or CodeGemma",
        param=param,
        code="fim_not_supported",
    )


def require_fim(model: ModelSupervisor, model_name: str, param: str) -> FimTokens:
    fim = model_fim_tokens(model)
    if fim is None:
        raise no_fim_error(model_name, param)
    return fim


# ---------------------------------------------------------------------- tokenizing as text

# tokenizer -> a copy that reads special-token text as plain text (per model, built once).
_PLAIN: weakref.WeakKeyDictionary[Tokenizer, Tokenizer] = weakref.WeakKeyDictionary()


def plain_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of `tokenizer` that never turns text into special tokens (llama.cpp's
    parse_special=false). A copy, because the switch is per tokenizer object and the shared
    one is used from several threads."""
    plain = _PLAIN.get(tokenizer)
    if plain is None:
        plain = Tokenizer.from_str(tokenizer.to_str())
        plain.encode_special_tokens = True
        _PLAIN[tokenizer] = plain
    return plain


# ---------------------------------------------------------------------- the prompt


@dataclass(frozen=True)
class ExtraFile:
    """Another file the model may read (llama-server's `input_extra` entry)."""

    text: str
    filename: str = DEFAULT_EXTRA_NAME


@dataclass
class FimPrompt:
    """A FIM prompt's ids; `truncated` when prefix, suffix or files were cut to fit.
    `stops` are the end tokens' texts the worker does not already stop at; the generation
    shows those tokens (`show_tokens`) so the stop matcher can end the answer there."""

    ids: list[int]
    truncated: bool
    stops: tuple[str, ...]
    show_tokens: frozenset[int]


def _trim(
    prefix: list[int], suffix: list[int], extra: list[int], room: int
) -> tuple[list[int], list[int], list[int]]:
    """Fit prefix + suffix + extra into `room` tokens as llama-server weighs them: files go
    first (their tail is kept), then prefix and suffix share what is left 3:1 (the prefix
    keeps its end, next to the cursor; the suffix its start)."""
    room = max(0, room)
    if len(prefix) + len(suffix) <= room:
        keep = room - len(prefix) - len(suffix)
        return prefix, suffix, extra[len(extra) - keep :] if keep else []
    keep_suffix = min(len(suffix), max(room // 4, room - len(prefix)))
    keep_prefix = min(len(prefix), room - keep_suffix)
    return prefix[len(prefix) - keep_prefix :], suffix[:keep_suffix], []


def build_fim_prompt(
    text: TextModel,
    fim: FimTokens,
    prefix: str,
    suffix: str,
    *,
    cursor: str = "",
    extra: Sequence[ExtraFile] = (),
    repo_level: bool = False,
    max_prompt_tokens: int | None = None,
) -> FimPrompt:
    """``[BOS] [files] <PRE> prefix cursor <SUF> suffix <MID>``. `cursor` (llama-server's
    `prompt`) is the text typed after the prefix; it is never cut. `repo_level`: write the
    repo header and a file separator before the prefix when the model has those tokens
    (llama-server's /infill), and the `extra` files before it. `max_prompt_tokens`: cut
    files, prefix and suffix until the prompt fits."""
    encode = plain_tokenizer(text.tokenizer).encode

    def ids(s: str) -> list[int]:
        return encode(s, add_special_tokens=False).ids if s else []

    head = [text.bos_id] if text.add_bos and text.bos_id is not None else []
    files: list[int] = []
    if repo_level or extra:
        if repo_level and fim.repo is not None:
            files += [fim.repo, *ids(REPO_NAME + "\n")]
        for f in extra:
            if fim.file_sep is not None:
                files += [fim.file_sep, *ids(f.filename + "\n")]
            else:
                files += ids(SNIPPET_MARKER)
            files += ids(f.text)
        if repo_level and fim.file_sep is not None:
            files += [fim.file_sep, *ids(CURRENT_FILE + "\n")]
    pre, suf, cur = ids(prefix), ids(suffix), ids(cursor)
    truncated = False
    if max_prompt_tokens is not None:
        fixed = len(head) + 3 + len(cur)
        if fixed + len(pre) + len(suf) + len(files) > max_prompt_tokens:
            truncated = True
            pre, suf, files = _trim(pre, suf, files, max_prompt_tokens - fixed)
    prompt = [*head, *files, fim.prefix, *pre, *cur, fim.suffix, *suf, fim.middle]
    ends = [t for t in fim.end_tokens() if t not in text.stop_token_ids]
    stops = tuple(text.tokenizer.decode([t], skip_special_tokens=False) for t in ends)
    return FimPrompt(prompt, truncated, tuple(s for s in stops if s), frozenset(ends))


async def completion_fim_prompt(
    model: ModelSupervisor, model_name: str, prefix: str, suffix: str, param: str = "suffix"
) -> FimPrompt:
    """The plain PSM prompt for a `suffix` request (/v1/completions, /api/generate); 400
    naming `param` when the model has no FIM tokens. Built off the event loop."""

    def build() -> FimPrompt:
        fim = require_fim(model, model_name, param)
        return build_fim_prompt(model.text, fim, prefix, suffix)

    return await asyncio.to_thread(build)


def with_fim_stops(req: SamplingFields, fim: FimPrompt | None) -> SamplingFields:
    """The request with the FIM end tokens' texts added to its stop strings (a copy)."""
    if fim is None or not fim.stops:
        return req
    return req.model_copy(update={"stop": [*req.stop_list(), *fim.stops]})


async def start_fim_text(
    ctx: RequestContext,
    req: SamplingFields,
    model: ModelSupervisor,
    prefix: str,
    suffix: str,
    *,
    model_name: str,
    param: str = "suffix",
) -> ChatRun:
    """A FIM generation read as plain `content` events (Ollama's `/api/generate` with
    `suffix`): chat_pipeline's start_text, with the FIM prompt and its end tokens."""
    fim = await completion_fim_prompt(model, model_name, prefix, suffix, param)
    prompt, max_tokens = await encode_prompt(req, model, fim.ids)
    make = choice_maker(
        ctx, with_fim_stops(req, fim), model, prompt, max_tokens, -1, None, fim.show_tokens
    )
    return ChatRun(run_choices(make, req.n), ChatOutputPlan(), req.n, len(prompt), _no_logprobs)


def _no_logprobs(tokens: list[int], lps: list[Any]) -> None:
    return None
