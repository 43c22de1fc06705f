"""The queue over time, for the dashboard and `slotd status`: the fleet's minute samples of
its backlog (slotd_queue_history), the outcome counts of the last minutes, and a replica's
leases written between heartbeats. The writes go through a worker's bounded write lane."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import Executor, _dicts, _sql


def sample_history(repo: Lanes) -> int:
    """This minute's backlog sample, unless another replica took it: the rows written."""
    count, _ = repo._write("history_sample", {})
    return max(count, 0)


def record_leases(repo: Lanes, replica_id: str, leases: Mapping[int, int]) -> None:
    """task id -> the slot holding it, for "running now", between two heartbeats."""
    payload = json.dumps({str(k): v for k, v in leases.items()})
    repo._write("replica_leases", {"replica_id": replica_id, "leases": payload})


def recent_outcomes(
    target: Executor, minutes: int, *, schema: str | None = None
) -> list[tuple[str, str, int]]:
    """(type, outcome, attempts) of the last `minutes` minutes."""
    rows = target.execute(_sql("recent_outcomes", schema), {"minutes": minutes}).fetchall()
    return [(task_type, outcome, int(n)) for task_type, outcome, n in rows]


def queue_history(
    target: Executor,
    unit: str,
    buckets: int,
    task_type: str | None = None,
    *,
    schema: str | None = None,
) -> list[dict[str, Any]]:
    """The backlog samples of the last `buckets` minutes or hours (`unit`), each bucket's
    highest, oldest first; one type's or every type's."""
    params = {"unit": unit, "buckets": buckets, "task_type": task_type}
    return _dicts(target.execute(_sql("dash_history", schema), params))
