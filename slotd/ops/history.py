"""The queue over time, as the supervisors record it for the dashboard and `slotd status`
(slotd/supervisor/recorder.py writes it): attempts by minute and outcome, the backlog by minute and
type, read back here. A storm of `lost` or `crashed` attempts (slots or runners dying,
leases expiring under their handlers) is what an operator must see first: it has a name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slotd.outcome import Outcome
from slotd.repository import Executor
from slotd.repository import history as record

STORM_WINDOW_MINUTES = 15
# Outcomes that mean the worker, not the handler, went wrong: any of them is worth a flag.
ALARMING = (Outcome.LOST, Outcome.CRASHED)
ALARM_REASONS = {
    "lost": "settlements refused: leases expired under their handlers, or slots died "
    "between outcome and settlement",
    "crashed": "runners died under their handlers (a crash, an OOM kill, a segfault)",
}


@dataclass
class RecentOutcomes:
    minutes: int
    by_outcome: dict[str, int] = field(default_factory=dict)
    by_type: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def alarming(self) -> dict[str, int]:
        """lost / crashed counts, those above zero only."""
        return {str(o): self.by_outcome[o] for o in ALARMING if self.by_outcome.get(o)}

    def as_json(self) -> dict[str, Any]:
        return {"minutes": self.minutes, "by_outcome": self.by_outcome, "by_type": self.by_type}


def recent_outcomes(
    target: Executor, minutes: int = STORM_WINDOW_MINUTES, *, schema: str | None = None
) -> RecentOutcomes:
    out = RecentOutcomes(minutes)
    for task_type, outcome, count in record.recent_outcomes(target, minutes, schema=schema):
        out.by_outcome[outcome] = out.by_outcome.get(outcome, 0) + int(count)
        out.by_type.setdefault(task_type, {})[outcome] = int(count)
    return out
