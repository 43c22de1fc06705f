"""What an enqueue gives back."""

from __future__ import annotations

from typing import Any


class EnqueuedId(int):
    """A task's id, as enqueue returns it: an int, and `.created` says whether this enqueue
    wrote the row (False: it deduped onto the live task holding the key)."""

    created: bool

    def __new__(cls, value: int, created: bool = True) -> EnqueuedId:
        self = super().__new__(cls, value)
        self.created = created
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (EnqueuedId, (int(self), self.created))
