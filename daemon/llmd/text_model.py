"""Everything the daemon knows about a model's text side: tokenizer, chat template, special
tokens, stop tokens, context length. Loaded from GGUF metadata or a Hugging Face directory;
never touches the weights."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGUFReader
from tokenizers import Tokenizer

from .tokenizer import tokenizer_from_dir, tokenizer_from_gguf_fields

# End-of-turn markers of common chat formats; any that exist in a vocabulary stop generation.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eom_id|>")


@dataclass
class TextModel:
    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str
    eos_token: str
    bos_id: int | None
    add_bos: bool
    stop_token_ids: list[int]
    context_length: int
    special_ids: set[int] = field(default_factory=set)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id, *ids]
        return ids

    def encode_rendered_chat(self, rendered: str) -> list[int]:
        """Templates that write the BOS themselves must not get a second one."""
        return self.encode(rendered)


def _stop_ids(tokenizer: Tokenizer, eos_id: int | None) -> list[int]:
    ids = [] if eos_id is None else [eos_id]
    for tok in _END_OF_TURN:
        tid = tokenizer.token_to_id(tok)
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids


def _field(reader: GGUFReader, key: str, default=None):  # type: ignore[no-untyped-def]
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def load_gguf_text_model(path: Path) -> TextModel:
    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture", "llama")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    tokenizer = tokenizer_from_gguf_fields(
        _field(reader, "tokenizer.ggml.model", "gpt2"),
        _field(reader, "tokenizer.ggml.pre", "default"),
        tokens,
        _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)),
        _field(reader, "tokenizer.ggml.merges", []),
    )
    bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
    eos_id = _field(reader, "tokenizer.ggml.eos_token_id")
    types = _field(reader, "tokenizer.ggml.token_type", [])
    return TextModel(
        tokenizer=tokenizer,
        chat_template=_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos_id] if bos_id is not None else "",
        eos_token=tokens[eos_id] if eos_id is not None else "",
        bos_id=bos_id,
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        stop_token_ids=_stop_ids(tokenizer, eos_id),
        context_length=int(_field(reader, f"{arch}.context_length", 4096)),
        special_ids={i for i, t in enumerate(types) if t == 3},
    )


def _token_text(value) -> str:  # type: ignore[no-untyped-def]
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""


def load_dir_text_model(path: Path) -> TextModel:
    tokenizer = tokenizer_from_dir(path)
    config = json.loads((path / "config.json").read_text())
    tk_config_file = path / "tokenizer_config.json"
    tk_config = json.loads(tk_config_file.read_text()) if tk_config_file.exists() else {}
    template = tk_config.get("chat_template")
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    bos = _token_text(tk_config.get("bos_token"))
    eos = _token_text(tk_config.get("eos_token"))
    bos_id = tokenizer.token_to_id(bos) if bos else config.get("bos_token_id")
    eos_cfg = config.get("eos_token_id")
    eos_id = (
        tokenizer.token_to_id(eos)
        if eos
        else (eos_cfg[0] if isinstance(eos_cfg, list) else eos_cfg)
    )
    stops = _stop_ids(tokenizer, eos_id)
    if isinstance(eos_cfg, list):
        stops += [i for i in eos_cfg if i not in stops]
    return TextModel(
        tokenizer=tokenizer,
        chat_template=template,
        bos_token=bos,
        eos_token=eos,
        bos_id=bos_id,
        add_bos=bool(tk_config.get("add_bos_token", False)),
        stop_token_ids=stops,
        context_length=int(config.get("max_position_embeddings", 4096)),
        special_ids={t.id for t in []},
    )


def load_text_model(path: Path) -> TextModel:
    return load_dir_text_model(path) if path.is_dir() else load_gguf_text_model(path)
