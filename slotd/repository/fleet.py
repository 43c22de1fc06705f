"""The fleet's shared record: replica heartbeats and departures, chore elections, and the
outcome counts the dashboard shows for the last hour."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import _dicts, _sql
from slotd.repository.queue import Limits
from slotd.repository.schema import newest_migration

HORIZON_COLUMNS = ("kind", "pid", "who", "state", "age_s", "xids")


@dataclass(frozen=True)
class Beat:
    """What a heartbeat read besides writing the replica's row (sql replica_heartbeat)."""

    lapse_s: float | None  # until the soonest final attempt's lease lapses (None: no lease)
    horizon: dict[str, Any] | None  # the horizon's holder, when asked for and there is one


class Fleet(Lanes):
    """What a replica writes about itself, and reads about the others."""

    def elect_chore(self, chore: str, period: timedelta) -> bool:
        """True on the one replica that runs `chore` this period (e.g. hourly retention)."""
        params = {"chore": chore, "period_s": period.total_seconds() * 0.95}
        return bool(self._write("elect_chore", params)[1])

    def heartbeat(
        self,
        replica_id: str,
        hostname: str,
        pid: int,
        slots: int,
        task_types: list[str],
        leases: Mapping[int, int] | None = None,
        limits: Limits | None = None,
        horizon: bool = False,
    ) -> Beat:
        """`leases`: task id -> the slot number holding it, for the dashboard. `horizon`:
        read who holds back vacuum in the same statement."""
        params = {
            "replica_id": replica_id,
            "hostname": hostname,
            "pid": pid,
            "slots": slots,
            "task_types": task_types,
            "leases": json.dumps({str(k): v for k, v in (leases or {}).items()}),
            "limits": json.dumps({k: list(v) for k, v in (limits or {}).items()}),
            # Which slotd runs there: `slotd status`, the dashboard, and the contract-step
            # guard of `slotd migrate` read them (sql/013).
            "version": _version(),
            "migration": newest_migration(),
            "horizon": horizon,
        }
        # Bounded like every queue write: a heartbeat stuck behind a lock must end.
        _, rows = self._write("replica_heartbeat", params)
        _, lapse_s, *holder = rows[0]
        found = dict(zip(HORIZON_COLUMNS, holder, strict=True)) if holder[0] else None
        return Beat(lapse_s, found)

    def record_outcomes(self, rows: Sequence[tuple[datetime, str, str, int]]) -> None:
        """Add (minute, type, outcome, count) rows to the dashboard's last-hour record."""
        if not rows:
            return
        minutes, types, outcomes, counts = (list(col) for col in zip(*rows, strict=True))
        params = {"minutes": minutes, "types": types, "outcomes": outcomes, "counts": counts}
        self._write("record_outcomes", params)  # bounded like every queue write

    def replica_gone(self, replica_id: str) -> None:
        self._write("replica_gone", {"replica_id": replica_id})

    def replicas(self) -> list[dict[str, Any]]:
        return _dicts(self.write.execute(_sql("replicas", self.schema)))

    def horizon_holder(self) -> dict[str, Any] | None:
        """What holds back the xmin horizon the longest (sql horizon_holder), or None."""
        rows = _dicts(self.write.execute(_sql("horizon_holder", self.schema)))
        return rows[0] if rows else None


def _version() -> str:
    from slotd import __version__  # the package imports the repository first

    return __version__
