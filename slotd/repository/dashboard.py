"""The web dashboard's reads (slotd.web), on one pooled connection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg

from slotd.repository.batches import BatchState, batch_of
from slotd.repository.control import OperatorControl, paused_types
from slotd.repository.dependencies import edges
from slotd.repository.named import _dicts, _sql, qualified, resolve_schema
from slotd.repository.results import result_of
from slotd.repository.schedules import Schedules
from slotd.repository.sequences import SequenceInfo, sequences


class DashboardReads:
    """The web dashboard's statements (slotd.web), on one connection. Every one is bounded
    by a cap or a limit; the counts use the gauges' predicates."""

    COUNT_CAP = 10_000
    OPTIONAL_TABLES = (
        "slotd_schedules",
        "slotd_queue_history",
        "slotd_rate_windows",
        "slotd_sequences",
    )

    def __init__(self, conn: psycopg.Connection[Any], *, schema: str | None = None) -> None:
        self.conn = conn
        self.schema = resolve_schema(schema)

    def replicas(self) -> list[dict[str, Any]]:
        # Without the prune of `replicas`: the dashboard may read from a hot standby.
        return _dicts(self.conn.execute(_sql("dash_replicas", self.schema)))

    def dead_list(
        self, task_type: str | None, *, limit: int, **search: Any
    ) -> list[dict[str, Any]]:
        return OperatorControl(self.conn).dead_list(task_type, limit=limit, **search)

    def types(self, limit: int = 500) -> list[str]:
        return [
            row[0] for row in self.conn.execute(_sql("dash_types", self.schema), {"limit": limit})
        ]

    def counts(self, types: Sequence[str]) -> list[dict[str, Any]]:
        params = {"types": list(types), "cap": self.COUNT_CAP}
        return _dicts(self.conn.execute(_sql("dash_counts", self.schema), params))

    def outcomes(
        self, unit: str, buckets: int, task_type: str | None = None
    ) -> list[dict[str, Any]]:
        """Attempts by minute or hour (`unit`), type and outcome, the last `buckets`."""
        params = {"unit": unit, "buckets": buckets, "task_type": task_type}
        return _dicts(self.conn.execute(_sql("dash_outcomes", self.schema), params))

    def running(self, lease_margin: timedelta, limit: int = 200) -> list[dict[str, Any]]:
        params = {"margin_s": lease_margin.total_seconds(), "limit": limit}
        return _dicts(self.conn.execute(_sql("dash_running", self.schema), params))

    def task(self, task_id: int) -> dict[str, Any] | None:
        rows = _dicts(self.conn.execute(_sql("dash_task", self.schema), {"id": task_id}))
        return rows[0] if rows else None

    def kept(self, task_id: int) -> dict[str, Any] | None:
        """A finished task's kept success (type, when, until when, whether its value is)."""
        rows = _dicts(self.conn.execute(_sql("dash_task_kept", self.schema), {"id": task_id}))
        return rows[0] if rows else None

    def attempts(
        self, task_id: int, before: int | None, limit: int, error_chars: int
    ) -> list[dict[str, Any]]:
        """One page of a task's remembered attempts, newest first, before attempt row
        `before` (the previous page's last id)."""
        params = {"id": task_id, "before": before, "limit": limit, "error_chars": error_chars}
        return _dicts(self.conn.execute(_sql("dash_attempts", self.schema), params))

    def attempt_count(self, task_id: int) -> int:
        params = {"id": task_id, "cap": self.COUNT_CAP}
        row = self.conn.execute(_sql("dash_attempt_count", self.schema), params).fetchone()
        return int(row[0]) if row else 0

    def steps(self, task_id: int, start: int, limit: int) -> list[dict[str, Any]]:
        """Steps `start`.. (0-based) of a task: number (1-based), name, at, size."""
        params = {"id": task_id, "from": start, "limit": limit}
        return _dicts(self.conn.execute(_sql("dash_steps", self.schema), params))

    def workflow(self, task_id: int) -> dict[str, Any]:
        """A task's place in workflows: its result (slotd.result's state, value, error),
        its parents and dependants (each with whether the parent succeeded), its batch."""
        found = result_of(self.conn, task_id, schema=self.schema)
        linked = edges(self.conn, task_id, schema=self.schema)
        return {
            "result": found,
            "parents": linked["parent"],
            "dependants": linked["dependant"],
        }

    def result(self, task_id: int) -> tuple[str, Any, str | None] | None:
        """slotd.result's (state, value, error) of a task, None for no such task."""
        return result_of(self.conn, task_id, schema=self.schema)

    def neighbours(self, task_id: int, limit: int) -> list[dict[str, Any]]:
        """A task's parents and dependants (side, id, task_type, state), `limit` a side."""
        params = {"id": task_id, "limit": limit}
        return _dicts(self.conn.execute(_sql("dash_neighbours", self.schema), params))

    def batch_graph(self, batch_id: int, limit: int) -> dict[str, Any] | None:
        """A batch's callback and ends by state, and its first `limit` members with a row."""
        rows = _dicts(self.conn.execute(_sql("dash_batch", self.schema), {"id": batch_id}))
        if not rows:
            return None
        params = {"id": batch_id, "limit": limit}
        members = _dicts(self.conn.execute(_sql("dash_batch_members", self.schema), params))
        return {**rows[0], "members": members}

    def batch(self, batch_id: int) -> BatchState | None:
        return batch_of(self.conn, batch_id, schema=self.schema)

    def dead_count(self, task_type: str | None) -> int:
        params = {"task_type": task_type, "cap": self.COUNT_CAP}
        return int(self.conn.execute(_sql("dash_dead_count", self.schema), params).fetchone()[0])  # type: ignore[index]

    def dead_page(
        self, search: Mapping[str, Any], after: tuple[Any, int] | None, limit: int
    ) -> list[dict[str, Any]]:
        """One keyset page of dead letters, newest first. `search`: task_type, ids, key
        (with key_types), error (a prefix of the error line; then also scan, how many dead
        letters it looks through, and a last row with window_end set says where it stopped)."""
        params = {"task_type": None, "ids": None, "key": None, "key_types": [], **search}
        params.update(after_at=after[0] if after else None, after_id=after[1] if after else None)
        params["limit"] = limit
        name = "dash_dead_errors" if params.get("error") else "dash_dead_page"
        return _dicts(self.conn.execute(_sql(name, self.schema), params))

    def tasks_page(
        self, search: Mapping[str, Any], after: tuple[Any, int] | None, limit: int
    ) -> list[dict[str, Any]]:
        """One keyset page of live tasks in due order; `search` as for dead_page."""
        params = {"task_type": None, "ids": None, "key": None, "key_types": [], **search}
        params.update(after_at=after[0] if after else None, after_id=after[1] if after else None)
        params["limit"] = limit
        return _dicts(self.conn.execute(_sql("dash_tasks_page", self.schema), params))

    def find(
        self, search: Mapping[str, Any], after_id: int | None, limit: int, scan: int
    ) -> list[dict[str, Any]]:
        """Tasks of a state and/or tag (live and dead), newest first: the matches among
        the next `scan` rows after `after_id`, and a last row with window_end set saying
        where the walk stopped. `search`: task_type, ids, key (with key_types), state, tag."""
        params = {
            "task_type": None, "ids": None, "key": None, "key_types": [], "state": None,
            "tag": None, **search, "after_id": after_id, "limit": limit, "scan": scan,
        }  # fmt: skip
        return _dicts(self.conn.execute(_sql("dash_find", self.schema), params))

    def kept_page(
        self, search: Mapping[str, Any], after_id: int | None, limit: int, scan: int
    ) -> list[dict[str, Any]]:
        """Succeeded tasks whose success is kept, newest first, walked as `find` walks;
        `search` as for `find` (its state is succeeded)."""
        params = {
            "task_type": search.get("task_type"), "ids": search.get("ids"),
            "key": search.get("key"), "tag": search.get("tag"),
            "after_id": after_id, "limit": limit, "scan": scan,
        }  # fmt: skip
        return _dicts(self.conn.execute(_sql("dash_kept_page", self.schema), params))

    def live_count(self, task_type: str, key: str | None) -> tuple[int, int]:
        """What `cancel --type T [--key K]` would cancel now: (live, running), capped."""
        params = {"task_type": task_type, "key": key, "cap": self.COUNT_CAP}
        row = self.conn.execute(_sql("dash_live_count", self.schema), params).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def tables(self) -> set[str]:
        names = {qualified(t, self.schema): t for t in self.OPTIONAL_TABLES}
        cur = self.conn.execute(_sql("dash_tables", self.schema), {"names": list(names)})
        return {names[row[0]] for row in cur}

    def schedules(self) -> list[dict[str, Any]]:
        """`slotd schedules`' statement (one row per schedule, a handful)."""
        return Schedules(self.conn, schema=self.schema).schedules_overview()

    def rows_of(self, table: str, limit: int = 200) -> list[dict[str, Any]]:
        """An optional capability's table, whatever its columns (only OPTIONAL_TABLES)."""
        name = {"slotd_schedules": "dash_schedules"}[table]
        return [row[0] for row in self.conn.execute(_sql(name, self.schema), {"limit": limit})]

    def rates(self) -> dict[str, dict[str, float]]:
        """Each rated type's window, as the gauges read it (see OperatorControl.gauges)."""
        out: dict[str, dict[str, float]] = {}
        for kind, task_type, value in self.conn.execute(_sql("dash_rates", self.schema)):
            out.setdefault(task_type, {})[kind[5:]] = float(value)
        return out

    def halted_sequences(self, limit: int = 10) -> list[SequenceInfo]:
        """The sequences a failed member halted (`slotd sequences --halted`'s statement),
        by name, at most `limit`."""
        return sequences(self.conn, halted=True, limit=limit, schema=self.schema)

    def paused(self) -> list[dict[str, Any]]:
        """The types paused now (`slotd pause`), as `slotd status` lists them."""
        return paused_types(self.conn, schema=self.schema)
