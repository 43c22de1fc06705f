"""Dependencies between tasks (enqueue(..., after=[ids])): the producer's side of the edges
(parents marked and locked, dependants made to wait) and the operator's cascade. The
settlements that release or cancel dependants are the queue protocol's (the `linked` parts
of slotd.repository.composed; rules in slotd/lifecycle/)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import AsyncExecutor, Executor, _sql


class UnknownParents(ValueError):
    """after= named tasks that are not live: never enqueued, finished, or dead."""


def parent_ids(after: Sequence[int] | None) -> list[int]:
    """after= as a list of distinct ids, refused in the caller's frame when not ints."""
    if after is None:
        return []
    if isinstance(after, int | str | bytes):
        raise TypeError("after= takes a list of task ids")
    ids: list[int] = []
    for task_id in after:
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise TypeError(f"after= takes task ids (ints), not {type(task_id).__name__}")
        # A plain int: a typed handle's id (an int subclass) beside a literal id would
        # otherwise be a list psycopg refuses to dump ("mixed types").
        if (plain := int(task_id)) not in ids:
            ids.append(plain)
    return ids


def _refused(parents: list[int], found: set[int]) -> None:
    missing = [p for p in parents if p not in found]
    if missing:
        listed = ", ".join(map(str, missing))
        raise UnknownParents(
            f"after=: task {listed} {'is' if len(missing) == 1 else 'are'} not live (never"
            " enqueued, already finished, failed or cancelled): nothing was enqueued"
        )


def mark_parents(target: Executor, parents: list[int], *, schema: str | None = None) -> None:
    """First statement of a dependant's enqueue: refuses (before anything is inserted)
    parents that are not live, and marks and locks the rest to the caller's commit."""
    rows = target.execute(_sql("depend_parents", schema), {"parents": parents}).fetchall()
    _refused(parents, {r[0] for r in rows})


async def mark_parents_async(
    target: AsyncExecutor, parents: list[int], *, schema: str | None = None
) -> None:
    cur = await target.execute(_sql("depend_parents", schema), {"parents": parents})
    _refused(parents, {r[0] for r in await cur.fetchall()})


def wait_on(
    target: Executor, children: list[int], parents: list[int], *, schema: str | None = None
) -> None:
    target.execute(_sql("depend_children", schema), {"children": children, "parents": parents})


async def wait_on_async(
    target: AsyncExecutor, children: list[int], parents: list[int], *, schema: str | None = None
) -> None:
    await target.execute(
        _sql("depend_children", schema), {"children": children, "parents": parents}
    )


def edges(
    target: Executor, task_id: int, *, schema: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """A task's parents and dependants (the dashboard's task page)."""
    out: dict[str, list[dict[str, Any]]] = {"parent": [], "dependant": []}
    for side, other, done in target.execute(_sql("dependency_edges", schema), {"id": task_id}):
        out[side].append({"id": other, "done": done})
    return out


class DependencyStore(Lanes):
    """The retention chore's side: edges whose dependant is gone."""

    def prune_dependencies_batch(self, batch: int = 5000) -> int:
        count, _ = self._write("dependencies_prune", {"batch": batch})
        return count
