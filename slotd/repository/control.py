"""Operator control: the fleet gauges, the dead letters (list, retry, purge, retention),
and cancel, pause and resume (in the caller's transaction, like enqueue)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slotd.config import priority_step
from slotd.repository.causes import PARENT_FAILED
from slotd.repository.lanes import Lanes
from slotd.repository.named import AsyncExecutor, Executor, _dicts, _sql
from slotd.repository.producing import PRIORITY_SPAN
from slotd.repository.queue import Limits, limit_params


def plain_ids(ids: Sequence[int] | None) -> list[int] | None:
    """Task ids as plain ints (None for none): enqueue's typed handles are an int subclass,
    and psycopg refuses to dump a list mixing them with literal ids ("mixed types")."""
    return [int(task_id) for task_id in ids] if ids else None


class OperatorControl(Lanes):
    """What the operator's commands and the metrics read and change on a worker's lanes."""

    # fleet view and maintenance (autocommit statements on the write lane)

    def gauges(self, limits: Limits | None = None) -> dict[str, Any]:
        """Fleet gauges. `limits`: tasks held back only by these limits are not counted as
        waiting in oldest_due_seconds (they wait on their own limit, not on the fleet)."""
        out: dict[str, Any] = {
            "pending": {},
            "running": {},
            "dead": {},
            "paused": {},
            "oldest_due_seconds": 0.0,
        }
        params = {"lead_s": self.lead_s, **limit_params(limits or {})}
        rates: dict[str, dict[str, float]] = {}
        for kind, task_type, value in self.read.execute(
            _sql("gauges", self.schema), params
        ).fetchall():
            if kind == "oldest_due":
                out["oldest_due_seconds"] = float(value or 0.0)
            elif kind.startswith("rate_"):
                rates.setdefault(task_type, {})[kind[5:]] = float(value)
            else:
                bucket = out[kind]
                bucket[task_type] = bucket.get(task_type, 0) + int(value)
        # Rate windows (sql/022), per type: used / allowed starts in its own window now,
        # window_s, free_s (seconds until the next start may come, 0: now), groups_full.
        out["rates"] = rates
        return out

    def dead_list(
        self,
        task_type: str | None = None,
        ids: Sequence[int] | None = None,
        limit: int = 100,
        key: str | None = None,
        key_types: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """Newest first; `key` is searched among `key_types` (or `task_type`)."""
        params = {
            "task_type": task_type,
            "ids": plain_ids(ids),
            "limit": limit,
            "key": key,
            "key_types": [task_type] if task_type else list(key_types),
        }
        return _dicts(self.read.execute(_sql("dead_list", self.schema), params))

    def dead_count(
        self,
        task_type: str | None = None,
        ids: Sequence[int] | None = None,
        older_than: timedelta | None = None,
    ) -> int:
        params = {
            "task_type": task_type,
            "ids": plain_ids(ids),
            "older_than_s": older_than.total_seconds() if older_than else None,
        }
        return int(self.read.execute(_sql("dead_count", self.schema), params).fetchone()[0])  # type: ignore[index]

    def end_lapsed(self) -> None:
        """A lease that is not live is no lease, for every operator action: final attempts
        whose lease lapsed with nobody left to settle them are ended first (the lapse sweep's
        statement), so a retry or purge acts on a dead letter whose end, batch count and
        dependants' cancel are written, never on one still waiting for them."""
        while True:
            # An operator's command knows no handler: a lapsed member halts its sequence.
            params = {
                "batch": 1000,
                "cause": PARENT_FAILED,
                "step_s": self.lead_s / PRIORITY_SPAN,
                "go_on": [],
            }
            _, rows = self._write("lapsed", params, before=("sequence_lock_lapsed", {}))
            if sum(int(n) for _, _, n in rows) < 1000:
                return

    def dead_retry_batch(
        self, task_type: str | None = None, ids: Sequence[int] | None = None, batch: int = 1000
    ) -> list[int]:
        self.end_lapsed()
        params = {"task_type": task_type, "ids": plain_ids(ids), "batch": batch}
        lock = {"ids": params["ids"], "task_type": task_type, "key": None, "dead": True}
        _, rows = self._write("dead_retry", params, before=("sequence_lock_targets", lock))
        return [row[0] for row in rows]

    def dead_purge_batch(
        self,
        task_type: str | None = None,
        ids: Sequence[int] | None = None,
        older_than: timedelta | None = None,
        batch: int = 5000,
    ) -> int:
        params = {
            "task_type": task_type,
            "ids": plain_ids(ids),
            "older_than_s": older_than.total_seconds() if older_than else None,
            "batch": batch,
        }
        self.end_lapsed()
        lock = {"ids": params["ids"], "task_type": task_type, "key": None, "dead": True}
        params["step_s"] = self.lead_s / PRIORITY_SPAN
        _, rows = self._write("dead_purge", params, before=("sequence_lock_targets", lock))
        return int(rows[0][0])

    def prune_dead(self, retention: timedelta, batch: int = 5000) -> int:
        """Retention: dead letters whose last attempt is older than the window, in batches
        so a million-row backlog never holds one long transaction."""
        total = 0
        while True:
            pruned = self.dead_purge_batch(older_than=retention, batch=batch)
            total += pruned
            if pruned < batch:
                return total

    def prune_rate_windows_batch(self, batch: int = 5000) -> int:
        """Rate windows (sql/022) with no start left in them: a group seen once, a type no
        longer started. Returns how many windows went (of at most `batch`)."""
        _, rows = self._write("rate_windows_prune", {"batch": batch})
        return int(rows[0][0])

    # ops

    def oldest_due_by_type(self) -> dict[str, float]:
        """Seconds the oldest claimable task of each type has been due (types with none
        are absent)."""
        rows = self.read.execute(
            _sql("oldest_due_by_type", self.schema), {"lead_s": self.lead_s}
        ).fetchall()
        return {task_type: float(seconds) for task_type, seconds in rows}


# operator control: cancel, pause, resume (in the caller's transaction, like enqueue)

CONTROL_CHANNEL = "slotd_control"  # public's; named schemas: named.channel


@dataclass(frozen=True)
class CancelledTask:
    id: int
    task_type: str
    running: bool  # under a live lease: its replica was told to stop it


def cancel_tasks(
    target: Executor,
    *,
    by: str,
    ids: Sequence[int] | None = None,
    task_type: str | None = None,
    key: str | None = None,
    batch: int = 1000,
    schema: str | None = None,
) -> list[CancelledTask]:
    """Cancel up to `batch` live tasks matching every filter given; returns those cancelled
    (a task that finished, is dead or was already cancelled is not among them)."""
    params = {
        "ids": plain_ids(ids),
        "task_type": task_type,
        "key": key,
        "by": by,
        "batch": batch,
    }
    # Sequences first (sql/080): the lock order every end of a member keeps.
    target.execute(_sql("sequence_lock_targets", schema), {**params, "dead": False})
    rows = target.execute(_sql("cancel", schema), params).fetchall()
    cancelled = [CancelledTask(*row) for row in rows]
    if cancelled:  # their dependants, transitively, in the same transaction
        ids = [t.id for t in cancelled]
        cause = f"cancelled: task %s, which it waits on, was cancelled by {by.replace('%', '%%')}"
        target.execute(_sql("cancel_dependants", schema), {"ids": ids, "cause": cause})
        ended = [t.id for t in cancelled if not t.running]
        step_s = priority_step().total_seconds()
        target.execute(_sql("sequence_passed", schema), {"ids": ended, "step_s": step_s})
    return cancelled


async def cancel_tasks_async(
    target: AsyncExecutor,
    *,
    by: str,
    ids: Sequence[int] | None = None,
    task_type: str | None = None,
    key: str | None = None,
    batch: int = 1000,
    schema: str | None = None,
) -> list[CancelledTask]:
    """cancel_tasks on an asyncio connection: the same statements."""
    params = {
        "ids": plain_ids(ids),
        "task_type": task_type,
        "key": key,
        "by": by,
        "batch": batch,
    }
    await target.execute(_sql("sequence_lock_targets", schema), {**params, "dead": False})
    cur = await target.execute(_sql("cancel", schema), params)
    cancelled = [CancelledTask(*row) for row in await cur.fetchall()]
    if cancelled:
        ids = [t.id for t in cancelled]
        cause = f"cancelled: task %s, which it waits on, was cancelled by {by.replace('%', '%%')}"
        await target.execute(_sql("cancel_dependants", schema), {"ids": ids, "cause": cause})
        ended = [t.id for t in cancelled if not t.running]
        step_s = priority_step().total_seconds()
        await target.execute(_sql("sequence_passed", schema), {"ids": ended, "step_s": step_s})
    return cancelled


def pause_type(
    target: Executor,
    task_type: str,
    *,
    by: str,
    until: datetime | None = None,
    for_seconds: float | None = None,
    schema: str | None = None,
) -> dict[str, Any]:
    params = {"task_type": task_type, "until": until, "for_s": for_seconds, "by": by}
    cur = target.execute(_sql("pause", schema), params)
    names = [col.name for col in cur.description or []]
    return dict(zip(names, cur.fetchone() or (), strict=True))


async def pause_type_async(
    target: AsyncExecutor,
    task_type: str,
    *,
    by: str,
    until: datetime | None = None,
    for_seconds: float | None = None,
    schema: str | None = None,
) -> dict[str, Any]:
    params = {"task_type": task_type, "until": until, "for_s": for_seconds, "by": by}
    cur = await target.execute(_sql("pause", schema), params)
    names = [col.name for col in cur.description or []]
    return dict(zip(names, await cur.fetchone() or (), strict=True))


def resume_type(
    target: Executor, task_type: str, *, by: str, schema: str | None = None
) -> bool | None:
    """True: it was paused; False: its pause had already ended; None: it was never paused."""
    row = target.execute(_sql("resume", schema), {"task_type": task_type, "by": by}).fetchone()
    return None if row is None else bool(row[0])


async def resume_type_async(
    target: AsyncExecutor, task_type: str, *, by: str, schema: str | None = None
) -> bool | None:
    cur = await target.execute(_sql("resume", schema), {"task_type": task_type, "by": by})
    row = await cur.fetchone()
    return None if row is None else bool(row[0])


def paused_types(target: Executor, *, schema: str | None = None) -> list[dict[str, Any]]:
    cur = target.execute(_sql("paused_types", schema))
    names = [col.name for col in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
