"""For the test modes only (slotd.testing): the queue's views of its rows, one task's
lease, and the queue's clock, moved by shifting the rows back in time."""

from __future__ import annotations

import uuid
from typing import Any

from slotd.repository.lanes import Lanes
from slotd.repository.named import _sql


class Inspection(Lanes):
    """What the eager and manual modes read and move besides the queue protocol."""

    def task_view(self, view: str, task_type: str | None = None) -> list[tuple[Any, ...]]:
        """'pending', 'running' or 'dead': (id, type, payload, attempts, key, run_at,
        last_error, dead) rows."""
        params = {"view": view, "task_type": task_type}
        return self.write.execute(_sql("task_view", self.schema), params).fetchall()

    def lease_of(self, task_id: int) -> tuple[uuid.UUID | None, bool] | None:
        row = self.write.execute(_sql("lease_of", self.schema), {"id": task_id}).fetchone()
        return (row[0], bool(row[1])) if row else None

    def shift_time(self, seconds: float) -> None:
        self.write.execute(_sql("set_time_offset", self.schema), {"seconds": seconds})

    def expire_leases(self) -> int:
        return self.write.execute(_sql("expire_leases", self.schema)).rowcount
