"""Sequences from the producer's side (enqueue(..., sequence=NAME), sql/080): the enqueue's
two extra statements around its insert, and the operator's resume of a halted sequence.
Every call runs in the caller's transaction and never commits it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from slotd.producer.targets import async_target, held, held_async, sync_target
from slotd.repository import NewTask
from slotd.repository import sequences as stored
from slotd.repository.named import resolve_schema
from slotd.repository.sequences import SequenceInfo

log = logging.getLogger("slotd.control")


def names_of(rows: Sequence[NewTask], parents: Sequence[int]) -> list[str | None]:
    """Each row's sequence, checked in the caller's frame before anything is written. A
    sequence's member cannot also wait on parents (after=): it waits on its sequence."""
    names = [stored.validate_sequence(r.sequence, r.task_type) for r in rows]
    if parents and any(names):
        raise ValueError(
            "sequence= cannot be combined with after= (a member waits on its sequence's head)"
        )
    return names


@contextmanager
def entered(
    target: Any, names: list[str | None], schema: str
) -> Iterator[Callable[[Sequence[int]], None]]:
    """Around an enqueue's insert: the sequences' rows locked and places drawn first (in
    the caller's transaction, or one of its own on an autocommit connection: the lock must
    last to the commit), and a function to place the new ids."""
    with held(target):
        places = stored.enter(target, names, schema=schema)

        def place(ids: Sequence[int]) -> None:
            stored.join(target, ids, _created(ids, names), places, schema=schema)

        yield place


def _created(ids: Sequence[int], names: list[str | None]) -> list[str | None]:
    """The names of the rows the enqueue created: a row deduped onto a live task keeps the
    place it has (its id's .created is False)."""
    return [n if getattr(i, "created", True) else None for i, n in zip(ids, names, strict=True)]


async def enter_async(target: Any, names: list[str | None], schema: str) -> list[int | None]:
    return await stored.enter_async(target, names, schema=schema)


async def join_async(
    target: Any,
    ids: Sequence[int],
    names: list[str | None],
    places: list[int | None],
    schema: str,
) -> None:
    await stored.join_async(target, ids, _created(ids, names), places, schema=schema)


def resume_sequence(conn: Any, name: str, *, schema: str | None = None) -> bool:
    """Resume a sequence halted by a member that ended failed: its next member becomes
    due (the failed one stays a dead letter). False when it was not halted."""
    target = sync_target(conn, "slotd.resume_sequence")
    with held(target):  # the halt cleared and the next made due under one lock
        resumed = stored.resume(target, [name], schema=resolve_schema(schema))
    if resumed:
        log.info("resumed sequence %s", name, extra={"sequence": name})
    return bool(resumed)


async def resume_sequence_async(conn: Any, name: str, *, schema: str | None = None) -> bool:
    target = await async_target(conn, "slotd.resume_sequence_async")
    async with held_async(target):
        resumed = await stored.resume_async(target, [name], schema=resolve_schema(schema))
    if resumed:
        log.info("resumed sequence %s", name, extra={"sequence": name})
    return bool(resumed)


def sequences(
    conn: Any, *, halted: bool = False, limit: int = 100, schema: str | None = None
) -> list[SequenceInfo]:
    """The sequences, the halted first (`halted`: only those)."""
    target = sync_target(conn, "slotd.sequences")
    return stored.sequences(target, halted=halted, limit=limit, schema=resolve_schema(schema))
