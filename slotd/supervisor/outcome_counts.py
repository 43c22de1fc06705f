"""The replica's outcome counters: what each settled attempt adds to /metrics and to the
dashboard's chart.

Every settlement the supervisor hears of comes here: from a slot's ledger or its pipe
(slot_pool.py, slot_messages.py), from a dead slot's lease settled on the chores
thread (orphans.py) and from the sweeps (chore_results.py). The minute tally
(`tally`) goes to slotd_outcomes, the dashboard's chart, by the chores thread's own flush:
every few seconds and at shutdown (recorder.py). Counting never writes: the loop
never waits on the database."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slotd.outcome import MinuteTally
from slotd.slot.ledger import Settled


class OutcomeCounts:
    def __init__(self, metrics: Callable[[], Any]) -> None:
        self._metrics = metrics  # the replica's Metrics, or None without a metrics server
        self.tally = MinuteTally()  # the dashboard's outcome chart, flushed by the chores

    def count(self, settled: Settled) -> None:
        task_type, outcome, duration, delay = settled
        if (metrics := self._metrics()) is not None:
            metrics.record_outcome(task_type, outcome, duration, delay)
        self.tally.add(task_type, outcome)

    def restarted(self, reason: str) -> None:
        if (metrics := self._metrics()) is not None:
            metrics.record_restart(reason)
