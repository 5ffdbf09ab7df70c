"""Incremental detokenization that never splits a UTF-8 character.

Byte-level BPE tokens can end in the middle of a multi-byte character; decoding then yields
U+FFFD. Text is only released once the decoded window no longer ends in an incomplete
character (the prefix/read-offset scheme used by TGI and vLLM), so every streamed delta is
valid UTF-8 and the concatenation of deltas equals the full decode.
"""

from __future__ import annotations

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_ids: set[int] | None = None) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_ids or set()
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def add(self, token_ids: list[int]) -> str:
        """Feed new tokens; returns the text that became complete."""
        self._ids.extend(t for t in token_ids if t not in self._skip)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end. A character cut off by max_tokens is
        dropped rather than sent as U+FFFD: the client never sees half a character."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :].rstrip(_REPLACEMENT)
