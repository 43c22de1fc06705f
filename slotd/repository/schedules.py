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
        stamp: datetime | None = None,
    ) -> tuple[list[tuple[Any, ...]], datetime | None, datetime | None]:
        """Create the rows of `schedules` (slotd.schedule.Schedule) that do not exist, take
        over the rows whose declaration this one supersedes (see schedules_declare), and
        record that this replica declares them. Returns (name, anchor_at, last_fire_at,
        ours, the row's expression) per schedule -- anchor None: created concurrently,
        declare again; ours: the row holds this declaration -- the replica's declaration
        stamp (`stamp`, or the database's clock on the first call) and the database's clock
        (plus `offset` seconds: the pytest plugin's advanced time)."""
        params = {
            "offset_s": offset,
            "stamp": stamp,
            "names": [sc.name for sc in schedules],
            "types": [sc.task_type for sc in schedules],
            "expressions": [sc.expression for sc in schedules],
            "zones": [sc.timezone for sc in schedules],
            "catch_ups": [sc.catch_up for sc in schedules],
            "fingerprints": [sc.fingerprint for sc in schedules],
            "replica_id": replica_id,
            "hostname": hostname,
            "pid": pid,
        }
        _, rows = self._write("schedules_declare", params)
        if not rows:
            return [], stamp, None
        return [tuple(row[:5]) for row in rows], rows[0][5], rows[0][6]

    def fire_schedules(
        self,
        advances: Sequence[tuple[Any, datetime | None, datetime]],
        fires: Sequence[tuple[Any, datetime]],
        max_attempts: int,
        offset: float = 0.0,
    ) -> list[tuple[str, bool, bool, datetime | None, list[int], datetime, str]]:
        """Advance each (Schedule, expected last fire, new last fire) by compare-and-set
        and insert the tasks of `fires` ((Schedule, fire time), oldest first) of the
        schedules that advanced, in one statement. Returns per schedule (name, advanced,
        the row still holds this declaration, its last fire now, the ids enqueued, the
        database's clock, the row's expression); a name missing from the result has no row
        (pruned): declare again."""
        params = {
            "names": [sc.name for sc, _, _ in advances],
            "expected": [expected for _, expected, _ in advances],
            "new_last": [new_last for _, _, new_last in advances],
            "fingerprints": [sc.fingerprint for sc, _, _ in advances],
            "expressions": [sc.expression for sc, _, _ in advances],
            "zones": [sc.timezone for sc, _, _ in advances],
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
        return [
            (name, ours, declared, last, list(ids), now, expression)
            for name, ours, declared, last, ids, now, expression in rows
        ]

    def schedules_gone(self, replica_id: str) -> None:
        self.write.execute(_sql("schedules_gone", self.schema), {"replica_id": replica_id})

    def schedules_overview(self) -> list[dict[str, Any]]:
        cur = self.write.execute(_sql("schedules_overview", self.schema))
        names = [col.name for col in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def prune_schedules(self) -> list[str]:
        _, rows = self._write("schedules_prune", {})
        return sorted(row[0] for row in rows)
