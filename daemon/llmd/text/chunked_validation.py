"""Validating long message lists a slice at a time, so the event loop keeps running.

Why: pydantic validates a whole request in one call into its Rust core, which holds the GIL
for all of it; a 100k-message body held it for 0.2-0.6 s at a time, and nothing else on the
daemon (not even `/health`) ran meanwhile, although the validation itself runs in a thread
(http_common.parsed_body). Validated a slice of messages at a time, the GIL is free between
slices; the model then takes the validated instances as they are (pydantic does not revalidate
instances of the field's own class). A slice that fails falls back to validating the whole
body, so error messages and their locations are exactly those of one call.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

SLICE = 500


@cache
def _list_adapter(item_type: Any) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[item_type])


def prevalidated(body: dict[str, Any], key: str, item_type: Any) -> dict[str, Any]:
    """`body` with `body[key]` replaced by its validated items when it is a long list; the
    body unchanged when it is short, not a list, or invalid (the caller's one-call validation
    then reports the problem)."""
    items = body.get(key)
    if not isinstance(items, list) or len(items) <= SLICE:
        return body
    adapter = _list_adapter(item_type)
    done: list[Any] = []
    try:
        for start in range(0, len(items), SLICE):
            done += adapter.validate_python(items[start : start + SLICE])
    except ValidationError:
        return body
    return {**body, key: done}
