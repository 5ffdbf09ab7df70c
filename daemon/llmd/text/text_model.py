"""Everything the daemon knows about a model's text side: tokenizer, chat template, special
tokens, stop tokens, context length. Loaded from GGUF metadata or a Hugging Face directory;
never touches the weights."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from llmd.errors import ApiError, server_error
from llmd.store.gguf_metadata import read_gguf_metadata
from llmd.store.manifests import ModelRecord
from llmd.text.gemma3_images import Gemma3ImageConfig
from llmd.text.gemma4_images import Gemma4ImageConfig
from llmd.text.logprobs import TokenTexts
from llmd.text.qwen_images import QwenImageConfig
from llmd.text.spm_tokenizer import CONTROL
from llmd.text.tokenizer import UnsupportedTokenizer, tokenizer_from_dir, tokenizer_from_gguf

log = logging.getLogger("llmd.models")

# End-of-generation markers: any of these present in a vocabulary stops generation, as in
# llama.cpp (src/llama-vocab.cpp), so a model ends its turn the same way under both engines.
END_OF_GENERATION_TOKENS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",  # Gemma 4 (and Gemma's declared EOS)
    "<turn|>",  # Gemma 4's end of turn
    "<|tool_response>",  # Gemma 4 waits for a tool's answer here
)


@dataclass
class TextModel:
    """The text side of one model. `special_ids` are control tokens: never shown as text."""

    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str
    eos_token: str
    bos_id: int | None
    add_bos: bool
    stop_token_ids: list[int]
    context_length: int
    special_ids: set[int] = field(default_factory=set)
    # GGUF `tokenizer.ggml.add_eos_token`: llama.cpp appends the end token to every input of
    # such a model (its converter sets it for Qwen3-Embedding, whose last-token pooling reads
    # that token). A Hugging Face tokenizer does it in its post-processor instead.
    add_eos_id: int | None = None
    # How the model's images are preprocessed and laid out in the prompt (gemma3_images.py,
    # gemma4_images.py, qwen_images.py), for a multimodal checkpoint whose vision half llmd
    # runs; None otherwise.
    image_config: Gemma3ImageConfig | Gemma4ImageConfig | QwenImageConfig | None = None

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, with the model's BOS when it wants one (and lacks it)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id, *ids]
        return ids

    @cached_property
    def token_texts(self) -> TokenTexts:
        """Bytes and display text of token ids (logprobs), built once per model."""
        return TokenTexts(self.tokenizer)

    def encode_rendered_chat(self, rendered: str) -> list[int]:
        """Templates that write the BOS themselves must not get a second one."""
        return self.encode(rendered)

    @cached_property
    def longest_token_chars(self) -> int:
        """Characters in the vocabulary's longest token (byte-level BPE spells each byte as
        one character, so this bounds the text one token can cover)."""
        return max((len(t) for t in self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` encodes to, without tokenizing it. Why: the
        tokenizer holds the GIL for its whole call (4 s for an 8 MB prompt, measured), which
        stalls every other request on the daemon's event loop; a prompt that cannot fit the
        context whatever its content is refused from its length alone. The factor 4 leaves
        room for normalizers that compose characters (NFC/NFKC) before tokenizing."""
        return len(text) // (4 * self.longest_token_chars)


def _stop_ids(tokenizer: Tokenizer, declared: list[int | None]) -> list[int]:
    """The declared end ids (eos, eot, eom) plus every end-of-generation token in the vocab."""
    ids: list[int] = []
    for tid in declared:
        if tid is not None and tid not in ids:
            ids.append(tid)
    for tok in END_OF_GENERATION_TOKENS:
        tid = tokenizer.token_to_id(tok)
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids


def load_gguf_text_model(path: Path, mmproj: Path | None = None) -> TextModel:
    """A GGUF file's text side; with `mmproj` (llama.cpp's vision tower file beside a
    Gemma 3 or Qwen3.5-MoE GGUF), how its images are preprocessed and laid out too."""
    meta = read_gguf_metadata(path)
    arch = meta.get("general.architecture", "llama")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    tokenizer = tokenizer_from_gguf(meta)
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    declared = [
        eos_id,
        meta.get("tokenizer.ggml.eot_token_id"),
        meta.get("tokenizer.ggml.eom_token_id"),
    ]
    return TextModel(
        tokenizer=tokenizer,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=tokens[bos_id] if bos_id is not None else "",
        eos_token=tokens[eos_id] if eos_id is not None else "",
        bos_id=bos_id,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        stop_token_ids=_stop_ids(tokenizer, declared),
        context_length=int(meta.get(f"{arch}.context_length", 4096)),
        special_ids={i for i, t in enumerate(types) if t == CONTROL},
        add_eos_id=eos_id if meta.get("tokenizer.ggml.add_eos_token") else None,
        image_config=_mmproj_image_config(mmproj, arch, tokens) if mmproj else None,
    )


def _mmproj_image_config(
    mmproj: Path, arch: str, tokens: list[str]
) -> Gemma3ImageConfig | QwenImageConfig | None:
    """The image settings of a GGUF Gemma 3 or Qwen3.5-MoE with an mmproj whose tower the
    worker runs; None (images refused) for another architecture or a vocabulary without the
    model's image tokens or an mmproj llmd cannot read (the worker then runs no tower
    either)."""
    if arch == "qwen35moe" and "<|image_pad|>" in tokens:
        reader = QwenImageConfig.from_mmproj
    elif arch == "gemma3" and "<image_soft_token>" in tokens:
        reader = Gemma3ImageConfig.from_mmproj
    else:
        return None
    try:
        return reader(read_gguf_metadata(mmproj))
    except (OSError, ValueError, KeyError) as exc:  # the text model still serves
        log.warning("images off: the mmproj %s cannot be read: %s", mmproj, exc)
        return None


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""


def _dir_special_ids(tokenizer: Tokenizer, tk_config: dict[str, Any]) -> set[int]:
    """Added tokens marked special (tokenizer_config.json's `added_tokens_decoder`)."""
    ids = {
        int(i)
        for i, tok in tk_config.get("added_tokens_decoder", {}).items()
        if isinstance(tok, dict) and tok.get("special")
    }
    for tid, tok in tokenizer.get_added_tokens_decoder().items():
        if tok.special:
            ids.add(tid)
    return ids


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (multimodal ones nest it in text_config)."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def load_dir_text_model(path: Path) -> TextModel:
    tokenizer = tokenizer_from_dir(path)
    config = json.loads((path / "config.json").read_text())
    tk_config_file = path / "tokenizer_config.json"
    tk_config = json.loads(tk_config_file.read_text()) if tk_config_file.exists() else {}
    template = tk_config.get("chat_template")
    if isinstance(template, list):  # older configs: named templates; chat uses "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
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
    stops = _stop_ids(tokenizer, [eos_id, *(eos_cfg if isinstance(eos_cfg, list) else [eos_cfg])])
    return TextModel(
        tokenizer=tokenizer,
        chat_template=template,
        bos_token=bos,
        eos_token=eos,
        bos_id=bos_id,
        add_bos=bool(tk_config.get("add_bos_token", False)),
        stop_token_ids=stops,
        context_length=int(_text_config(config).get("max_position_embeddings", 4096)),
        special_ids=_dir_special_ids(tokenizer, tk_config),
        image_config=_image_config(path, config),
    )


def _image_config(
    path: Path, config: dict[str, Any]
) -> Gemma3ImageConfig | Gemma4ImageConfig | QwenImageConfig | None:
    """A Gemma 3, Gemma 4 or Qwen3.5 multimodal checkpoint's image settings (its
    preprocessor_config.json, or processor_config.json's `image_processor`, the processor's
    defaults where it has neither)."""
    kind = config.get("model_type")
    if kind not in ("gemma3", "gemma4", "qwen3_5", "qwen3_5_moe"):
        return None
    if not isinstance(config.get("vision_config"), dict):
        return None
    pre_file = path / "preprocessor_config.json"
    processor_file = path / "processor_config.json"
    pre: dict[str, Any] = {}
    if pre_file.exists():
        pre = json.loads(pre_file.read_text())
    elif processor_file.exists():
        pre = json.loads(processor_file.read_text()).get("image_processor") or {}
    if kind == "gemma3":
        return Gemma3ImageConfig.from_hf(pre, config)
    if kind == "gemma4":
        return Gemma4ImageConfig.from_hf(pre)
    return QwenImageConfig.from_hf(pre)


def load_text_model(path: Path, mmproj: Path | None = None) -> TextModel:
    """A GGUF file's (with its mmproj, if any) or a Hugging Face directory's text side."""
    return load_dir_text_model(path) if path.is_dir() else load_gguf_text_model(path, mmproj)


def load_served_text_model(record: ModelRecord) -> TextModel:
    """The text side of a model about to be served (the registry's `load_text`): an
    unsupported tokenizer is the client's 400, an unreadable file the server's 500."""
    try:
        text = load_text_model(Path(record.path), Path(record.mmproj) if record.mmproj else None)
    except UnsupportedTokenizer as exc:
        raise ApiError(
            400, f"model '{record.name}' cannot be served: {exc}", param="model"
        ) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise server_error(
            f"model '{record.name}' could not be read from {record.path}: {exc}",
            code="model_load_failed",
        ) from exc
    if not text.chat_template:
        log.warning("model %s has no chat template; chat requests are refused", record.name)
    return text
