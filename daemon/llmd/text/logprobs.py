"""Token logprobs in OpenAI's shapes: chat (`logprobs.content[]` with token, logprob, bytes and
top_logprobs) and legacy completions (`tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`).

A token's text is its own bytes, which may be part of a UTF-8 character (OpenAI returns those
with the raw bytes in `bytes` and replacement characters in `token`): byte-level BPE tokens
(GPT-2 style, as SmolLM2, Llama 3, Qwen) map each character back to a byte; SentencePiece
tokens use `<0xNN>` for bytes and `▁` for spaces.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from tokenizers import Tokenizer

from llmd.runtime import protocol as p


@cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, inverted."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenTexts:
    """Bytes and display text of token ids, for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
        self._byte_level = "ByteLevel" in kinds
        self._cache: dict[int, bytes] = {}

    def bytes_of(self, token: int) -> bytes:
        cached = self._cache.get(token)
        if cached is not None:
            return cached
        piece = self._tokenizer.id_to_token(token) or ""
        if self._byte_level:
            table = _byte_level_decoder()
            if all(ch in table for ch in piece):
                out = bytes(table[ch] for ch in piece)
            else:  # an added token (e.g. <|im_end|>) is its own text
                out = piece.encode()
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out = bytes([int(piece[3:5], 16)])
        else:
            out = piece.replace("▁", " ").encode()
        self._cache[token] = out
        return out

    def text_of(self, token: int) -> str:
        return self.bytes_of(token).decode("utf-8", errors="replace")

    def chat_entry(self, token: int, lp: p.TokenLogprob) -> dict[str, Any]:
        return {
            "token": self.text_of(token),
            "logprob": lp.logprob,
            "bytes": list(self.bytes_of(token)),
            "top_logprobs": [
                {"token": self.text_of(t), "logprob": v, "bytes": list(self.bytes_of(t))}
                for t, v in lp.top
            ],
        }

    def completion_logprobs(
        self, tokens: list[int], lps: list[p.TokenLogprob | None], text_offset: int
    ) -> dict[str, Any]:
        """Legacy shape for `tokens` starting at character `text_offset` of the choice text
        (None logprob: the prompt's first token, which has no context)."""
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        offset = text_offset
        for token, lp in zip(tokens, lps, strict=True):
            text = self.text_of(token)
            out["tokens"].append(text)
            out["token_logprobs"].append(None if lp is None else lp.logprob)
            out["top_logprobs"].append(
                None if lp is None else {self.text_of(t): v for t, v in lp.top}
            )
            out["text_offset"].append(offset)
            offset += len(text)
        return out
