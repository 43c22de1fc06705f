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
