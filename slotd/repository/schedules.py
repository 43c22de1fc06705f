"""Periodic schedules (sql/queries_schedules.sql): declared by every replica, fired by
compare-and-set so that one fire time enqueues once across the fleet."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import _sql


class Schedules(Lanes):
    """The schedule rows: declare, fire, prune, and the overview `slotd schedules` shows."""

    def declare_schedules(
        self,
        replica_id: str,
        hostname: str,
        pid: int,
        schedules: Sequence[Any],
        offset: float = 0.0,
    ) -> tuple[list[tuple[str, datetime | None, datetime | None]], datetime]:
        """Create the rows of `schedules` (slotd.schedule.Schedule) that do not exist and
        record that this replica declares them. Returns (name, anchor_at, last_fire_at)
        per schedule -- anchor None: created concurrently, declare again -- and the
        database's clock (plus `offset` seconds: the pytest plugin's advanced time)."""
        params = {
            "offset_s": offset,
            "names": [sc.name for sc in schedules],
            "types": [sc.task_type for sc in schedules],
            "expressions": [sc.expression for sc in schedules],
            "zones": [sc.timezone for sc in schedules],
            "catch_ups": [sc.catch_up for sc in schedules],
            "replica_id": replica_id,
            "hostname": hostname,
            "pid": pid,
        }
        _, rows = self._write("schedules_declare", params)
        now = rows[0][3] if rows else None
        return [(name, anchor, last) for name, anchor, last, _ in rows], now  # type: ignore[return-value]

    def fire_schedules(
        self,
        advances: Sequence[tuple[str, datetime | None, datetime]],
        fires: Sequence[tuple[Any, datetime]],
        max_attempts: int,
        offset: float = 0.0,
    ) -> list[tuple[str, bool, datetime | None, list[int], datetime]]:
        """Advance each (name, expected last fire, new last fire) by compare-and-set and
        insert the tasks of `fires` ((Schedule, fire time), oldest first) of the schedules
        that advanced, in one statement. Returns per schedule (name, advanced, its last
        fire now, the ids enqueued, the database's clock); a name missing from the result
        has no row (pruned): declare again."""
        params = {
            "names": [name for name, _, _ in advances],
            "expected": [expected for _, expected, _ in advances],
            "new_last": [new_last for _, _, new_last in advances],
            "f_names": [sc.name for sc, _ in fires],
            "f_at": [at for _, at in fires],
            "f_types": [sc.task_type for sc, _ in fires],
            "f_payloads": [sc.payload_json for sc, _ in fires],
            "f_keys": [sc.key_for(at) for sc, at in fires],
            "f_skip_live": [sc.overlap == "skip" for sc, _ in fires],
            "max_attempts": max_attempts,
            "offset_s": offset,
        }
        _, rows = self._write("schedules_fire", params)
        return [(name, ours, last, list(ids), now) for name, ours, last, ids, now in rows]

    def schedules_gone(self, replica_id: str) -> None:
        self.write.execute(_sql("schedules_gone"), {"replica_id": replica_id})

    def schedules_overview(self) -> list[dict[str, Any]]:
        cur = self.write.execute(_sql("schedules_overview"))
        names = [col.name for col in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def prune_schedules(self) -> list[str]:
        _, rows = self._write("schedules_prune", {})
        return sorted(row[0] for row in rows)
