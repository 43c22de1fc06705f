"""The enqueue hook the test modes listen on (slotd.enqueue calls it with each batch's ids
and the schema they were written in)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from slotd.repository import Executor

# The module, not the function of the same name that slotd/__init__ re-exports over it.
_enqueue_module = importlib.import_module("slotd.producer.enqueue")


# enqueue hooks: eager mode and capture() both listen to slotd.enqueue, and may nest in
# either order, so they share one dispatcher instead of overwriting each other.

Hook = Callable[[Executor, list[int], str], None]
_hooks: list[Hook] = []
_foreign_hook: Any = None


def _dispatch(target: Executor, ids: list[int], schema: str) -> None:
    for hook in list(_hooks):
        hook(target, ids, schema)
    if _foreign_hook is not None:
        _foreign_hook(target, ids, schema)


@contextmanager
def _hooked(hook: Hook, *, first: bool = False) -> Iterator[None]:
    global _foreign_hook
    if not _hooks and _enqueue_module._hook not in (None, _dispatch):
        _foreign_hook = _enqueue_module._hook  # someone else's hook keeps working
    # Recorders go first so that a capture() sees an id before eager mode runs its task
    # (which may enqueue more).
    _hooks.insert(0, hook) if first else _hooks.append(hook)
    _enqueue_module._hook = _dispatch
    try:
        yield
    finally:
        _hooks.remove(hook)
        if not _hooks:
            _enqueue_module._hook = _foreign_hook
            _foreign_hook = None
