"""Sequences (enqueue(..., sequence=NAME), sql/080): the producer's side (a place drawn in
commit order, the new members made to wait behind the head) and the operator's (the list,
the resume). The settlements that move a sequence on are the queue protocol's (fragment
`sequence_moved`, spliced into every statement that ends a task)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slotd.config import priority_step
from slotd.repository.named import AsyncExecutor, Executor, _dicts, _sql

# A sequence's name, as a key's: any text up to this long.
NAME_MAX = 200


def validate_sequence(value: object, task_type: str) -> str | None:
    """`value` if it can name a sequence, else TypeError / ValueError naming the task."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"task {task_type!r}: sequence must be a string, not {value!r}")
    if not value or len(value) > NAME_MAX or "\x00" in value:
        raise ValueError(
            f"task {task_type!r}: sequence must be a non-empty string of at most {NAME_MAX}"
            " characters"
        )
    return value


def _counts(names: Sequence[str | None]) -> dict[str, Any]:
    counted: dict[str, int] = {}
    for name in names:
        if name is not None:
            counted[name] = counted.get(name, 0) + 1
    return {"names": list(counted), "counts": list(counted.values())}


def _places(names: Sequence[str | None], drawn: dict[str, int]) -> list[int | None]:
    """Each row's place: the places its sequence drew, in the rows' order (the enqueue's
    own order is the order of its members)."""
    counted: dict[str, int] = {}
    for name in names:
        if name is not None:
            counted[name] = counted.get(name, 0) + 1
    first = {name: drawn[name] - n + 1 for name, n in counted.items()}
    places: list[int | None] = []
    for name in names:
        if name is None:
            places.append(None)
        else:
            places.append(first[name])
            first[name] += 1
    return places


def enter(target: Executor, names: Sequence[str | None], *, schema: str) -> list[int | None]:
    """First statement of an enqueue into sequences (sql `sequence_enter`): each sequence's
    row locked to the caller's commit and the rows' places drawn, in commit order."""
    rows = target.execute(_sql("sequence_enter", schema), _counts(names)).fetchall()
    return _places(names, {name: int(last) for name, last, _halted in rows})


async def enter_async(
    target: AsyncExecutor, names: Sequence[str | None], *, schema: str
) -> list[int | None]:
    cur = await target.execute(_sql("sequence_enter", schema), _counts(names))
    rows = await cur.fetchall()
    return _places(names, {name: int(last) for name, last, _halted in rows})


def _join_params(
    ids: Sequence[int], names: Sequence[str | None], places: Sequence[int | None]
) -> dict[str, Any]:
    chosen = [(i, n, p) for i, n, p in zip(ids, names, places, strict=True) if n is not None]
    return {
        "ids": [i for i, _, _ in chosen],
        "names": [n for _, n, _ in chosen],
        "positions": [p for _, _, p in chosen],
    }


def join(
    target: Executor,
    ids: Sequence[int],
    names: Sequence[str | None],
    places: Sequence[int | None],
    *,
    schema: str,
) -> None:
    """After the rows' insert: each new member placed, waiting behind its sequence's head
    (sql `sequence_join`). `ids`: the rows the enqueue created, in the input's order (a
    row deduped onto a live task is not placed again: its name is None here)."""
    params = _join_params(ids, names, places)
    if params["ids"]:
        target.execute(_sql("sequence_join", schema), params)


async def join_async(
    target: AsyncExecutor,
    ids: Sequence[int],
    names: Sequence[str | None],
    places: Sequence[int | None],
    *,
    schema: str,
) -> None:
    params = _join_params(ids, names, places)
    if params["ids"]:
        await target.execute(_sql("sequence_join", schema), params)


@dataclass(frozen=True)
class SequenceInfo:
    """A sequence as `slotd sequences` and `slotd status` show it."""

    name: str
    halted_by: int | None  # the member whose failure halted it (None: not halted)
    halted_at: datetime | None
    halted_type: str | None
    halted_error: str | None
    holding: int  # members not ended (the head and those waiting behind it)
    head: int | None  # the member that runs next, or runs now

    @property
    def halted(self) -> bool:
        return self.halted_by is not None


def sequences(
    target: Executor,
    *,
    halted: bool = False,
    name: str | None = None,
    limit: int = 100,
    schema: str | None = None,
) -> list[SequenceInfo]:
    """Sequences, the halted first (`halted`: only those)."""
    params = {"halted": halted, "name": name, "limit": limit}
    rows = _dicts(target.execute(_sql("sequences_list", schema), params))
    return [
        SequenceInfo(
            r["name"],
            r["halted_by"],
            r["halted_at"],
            r["task_type"],
            r["last_error"],
            int(r["holding"]),
            r["head"],
        )
        for r in rows
    ]


def halted_count(target: Executor, *, schema: str | None = None) -> int:
    row = target.execute(_sql("sequences_halted_count", schema)).fetchone()
    return int(row[0]) if row else 0


def resume(target: Executor, names: Sequence[str], *, schema: str | None = None) -> list[str]:
    """Clear the halts of `names` and make each one's next member due (sql
    `sequence_resume`, then `sequence_advance` in a new statement); the names that were
    halted."""
    rows = target.execute(_sql("sequence_resume", schema), {"names": list(names)}).fetchall()
    params = {"names": [str(r[0]) for r in rows], "step_s": priority_step().total_seconds()}
    target.execute(_sql("sequence_advance", schema), params)
    return [str(name) for name, was in rows if was is not None]


async def resume_async(
    target: AsyncExecutor, names: Sequence[str], *, schema: str | None = None
) -> list[str]:
    cur = await target.execute(_sql("sequence_resume", schema), {"names": list(names)})
    rows = await cur.fetchall()
    params = {"names": [str(r[0]) for r in rows], "step_s": priority_step().total_seconds()}
    await target.execute(_sql("sequence_advance", schema), params)
    return [str(name) for name, was in rows if was is not None]
