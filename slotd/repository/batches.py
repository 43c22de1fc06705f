"""Batches (slotd.batch): the producer's side (the batch row, its tasks joining it, the
seal at the block's end), the operators' reads, and the retention chore's prune. The
counting of a batch's ends is the settlements' (sql `batch_counted`; rules in
slotd/lifecycle/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import AsyncExecutor, Executor, _sql


@dataclass(frozen=True)
class BatchInFlight:
    id: int
    callback_type: str
    total: int
    done: int
    age_s: float


@dataclass(frozen=True)
class BatchState:
    id: int
    callback_type: str
    total: int
    done: int
    succeeded: int  # these four: set once the batch completed (in flight: see `done`)
    failed: int
    cancelled: int
    expired: int
    callback_id: int | None
    created_at: datetime
    completed_at: datetime | None


def _open_params(task_type: str, payload: str, max_attempts: int, explicit: bool) -> dict[str, Any]:
    return {
        "task_type": task_type,
        "payload": payload,
        "max_attempts": max_attempts,
        "explicit": explicit,
    }


def open_batch(
    target: Executor,
    task_type: str,
    payload: str,
    *,
    max_attempts: int,
    explicit: bool,
    schema: str | None = None,
) -> int:
    params = _open_params(task_type, payload, max_attempts, explicit)
    row = target.execute(_sql("batch_open", schema), params).fetchone()
    assert row is not None
    return int(row[0])


async def open_batch_async(
    target: AsyncExecutor,
    task_type: str,
    payload: str,
    *,
    max_attempts: int,
    explicit: bool,
    schema: str | None = None,
) -> int:
    params = _open_params(task_type, payload, max_attempts, explicit)
    cur = await target.execute(_sql("batch_open", schema), params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def join_batch(
    target: Executor, batch_id: int, ids: list[int], *, schema: str | None = None
) -> None:
    if ids:
        target.execute(_sql("batch_join", schema), {"batch": batch_id, "ids": ids})


async def join_batch_async(
    target: AsyncExecutor, batch_id: int, ids: list[int], *, schema: str | None = None
) -> None:
    if ids:
        await target.execute(_sql("batch_join", schema), {"batch": batch_id, "ids": ids})


def seal_batch(target: Executor, batch_id: int, *, schema: str | None = None) -> int | None:
    """The block ended; the callback's id when the batch completed at once (empty)."""
    row = target.execute(_sql("batch_seal", schema), {"batch": batch_id}).fetchone()
    return None if row is None or row[1] is None else int(row[1])


async def seal_batch_async(
    target: AsyncExecutor, batch_id: int, *, schema: str | None = None
) -> int | None:
    cur = await target.execute(_sql("batch_seal", schema), {"batch": batch_id})
    row = await cur.fetchone()
    return None if row is None or row[1] is None else int(row[1])


def batches_in_flight(
    target: Executor, limit: int = 50, *, schema: str | None = None
) -> list[BatchInFlight]:
    rows = target.execute(_sql("batches_in_flight", schema), {"limit": limit}).fetchall()
    return [BatchInFlight(*row) for row in rows]


def batch_of(target: Executor, batch_id: int, *, schema: str | None = None) -> BatchState | None:
    row = target.execute(_sql("batch_of", schema), {"id": batch_id}).fetchone()
    return None if row is None else BatchState(*row)


class BatchStore(Lanes):
    """The retention chore's side: batches completed longer ago than the retention."""

    def prune_batches(self, older_than_s: float, batch: int = 5000) -> int:
        params: Mapping[str, Any] = {"older_than_s": older_than_s, "batch": batch}
        _, rows = self._write("batches_prune", params)
        return int(rows[0][0]) if rows else 0
