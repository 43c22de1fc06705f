"""Payloads as PostgreSQL will store them: a JSON object, encoded (and refused) in the
caller's own frame, before anything is written."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# An escaped NUL that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode(payload: Mapping[str, Any] | None, what: str) -> str:
    """The JSON text of `payload`, or TypeError naming `what`: not an object, not
    serializable, NaN/Infinity, or a NUL character (jsonb cannot hold one)."""
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise TypeError(f"{what}: payload must be a JSON object (a dict)")
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what}: payload is not JSON-serializable: {exc}") from None
    if "\\u0000" in text and _NUL.search(text):
        raise TypeError(f"{what}: payload contains a NUL character, which PostgreSQL cannot store")
    return text


# A stored result travels in the slot's last words (slotd/slot/ledger.py) before it is written, so
# it is bounded: a return value larger than this is the handler's error, not a truncation.
RESULT_MAX = 256 * 1024


def encode_result(value: Any, what: str) -> str:
    """The JSON text of a handler's return value, or TypeError naming `what`: not
    serializable, NaN/Infinity, a NUL character, or more than RESULT_MAX bytes."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what}: return value is not JSON-serializable: {exc}") from None
    if "\\u0000" in text and _NUL.search(text):
        raise TypeError(f"{what}: return value contains a NUL character, which jsonb cannot store")
    if len(text) > RESULT_MAX:
        raise TypeError(
            f"{what}: return value is {len(text)} bytes of JSON, over the {RESULT_MAX} bytes"
            " a stored result may hold; store it elsewhere and return a reference"
        )
    return text
