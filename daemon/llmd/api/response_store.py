"""Stored Responses (`store: true`, the default): what `previous_response_id`,
`GET /v1/responses/{id}` and `DELETE /v1/responses/{id}` read.

Each entry keeps the response object as it was returned, its own input items (for
`GET .../input_items`), the whole conversation that produced it (prior history + this input +
this output as an assistant message, in the internal `ChatCompletionRequest` message form, so
a follow-up only appends its new input) and the id of the named session its chain runs in (so a
follow-up's KV stays pinned in the worker and its prefix is reused).

Why in memory, bounded and expiring: a local daemon serving agents must not grow without bound,
and stored conversations are only worth keeping while a client may continue them. At most
`max_entries` responses are kept (the least recently used goes first) and each expires `ttl`
seconds after its last use (stored, continued or fetched). Nothing survives a daemon restart.
History lists share their message dicts with the parent entry, so a long chain costs one
pointer per message per response, not a copy of the text.

With `store: false` (Codex's way) nothing is kept here: the client sends the whole history every
turn, and a reasoning item's thinking travels in its `encrypted_content` (asked for with
`include: ["reasoning.encrypted_content"]`). That blob is opaque to the client but not secret:
it is the text, compressed and tagged so llmd can recognise and read its own
(:func:`seal_reasoning`, :func:`open_reasoning`). It is not encrypted because it holds nothing
the client did not already receive; a blob llmd cannot read (another provider's) is ignored,
which changes no answer since chat templates drop earlier turns' thinking.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_RESPONSES = 1000
DEFAULT_RESPONSE_TTL = 3600.0  # seconds since last use


@dataclass
class StoredResponse:
    id: str
    response: dict[str, Any]  # the response object as the client received it
    input_items: list[dict[str, Any]]  # this request's input items, with ids
    messages: list[dict[str, Any]]  # the conversation so far, this response's output included
    session_id: str  # the chain's named session (shared by every response of the chain)
    last_used: float = field(default_factory=time.time)


class ResponseStore:
    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_RESPONSES,
        ttl: float = DEFAULT_RESPONSE_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1 or ttl <= 0:
            raise ValueError("a response store needs max_entries >= 1 and ttl > 0")
        self.max_entries = max_entries
        self.ttl = ttl
        self.clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        """Stores (or replaces) `entry` as the most recently used; evicts the least recently
        used beyond `max_entries`."""
        self._expire()
        entry.last_used = self.clock()
        self._entries[entry.id] = entry
        self._entries.move_to_end(entry.id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        """The live entry (its use renews its TTL), or None when unknown or expired."""
        self._expire()
        entry = self._entries.get(rid)
        if entry is None:
            return None
        entry.last_used = self.clock()
        self._entries.move_to_end(rid)
        return entry

    def delete(self, rid: str) -> StoredResponse | None:
        self._expire()
        return self._entries.pop(rid, None)

    def session_in_use(self, session_id: str) -> bool:
        """Whether any stored response still belongs to the chain of `session_id`."""
        return any(e.session_id == session_id for e in self._entries.values())

    def _expire(self) -> None:
        """Drops entries idle past the TTL. The dict is in last-use order, so the expired ones
        are at its front."""
        deadline = self.clock() - self.ttl
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.last_used > deadline:
                break
            self._entries.popitem(last=False)


_SEAL = "llmd1:"


def seal_reasoning(text: str) -> str:
    """A reasoning item's `encrypted_content`: the thinking, compressed, tagged as llmd's."""
    packed = zlib.compress(json.dumps({"text": text}, ensure_ascii=False).encode())
    return _SEAL + base64.urlsafe_b64encode(packed).decode("ascii")


def open_reasoning(blob: object) -> str | None:
    """The thinking inside an `encrypted_content` llmd sealed; None for anything else."""
    if not isinstance(blob, str) or not blob.startswith(_SEAL):
        return None
    try:
        value = json.loads(zlib.decompress(base64.urlsafe_b64decode(blob[len(_SEAL) :])))
    except (ValueError, binascii.Error, zlib.error):
        return None
    text = value.get("text") if isinstance(value, dict) else None
    return text if isinstance(text, str) else None
