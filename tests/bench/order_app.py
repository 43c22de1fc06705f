"""The order bench's applications (tests/bench/order.py): no-op handlers, one registry per
scenario, so each scenario's daemon claims as such a deployment would (a registry with a
fair type discovers before every claim; one without claims as before)."""

from __future__ import annotations

from datetime import timedelta

import slotd

CEILING = timedelta(seconds=30)


def _noop(task: slotd.Task, ctx: slotd.Context) -> None:
    pass


# 10,000 groups of one task and one of 100,000: fair, and the same type without turns.
fair = slotd.Registry()
fair.register("bo.fair", _noop, ceiling=CEILING, fair=True)
grouped = slotd.Registry()
grouped.register("bo.fair", _noop, ceiling=CEILING)

# 1,000 sequences.
sequences = slotd.Registry()
sequences.register("bo.seq", _noop, ceiling=CEILING)

# 100 types under one shared limit (not binding: 1,000 at once), and the same types without.
limits = slotd.Registry()
limits.limit("provider", max_running=1000)
unlimited = slotd.Registry()
TYPES = [f"bo.lim.{i:03d}" for i in range(100)]
for name in TYPES:
    limits.register(name, _noop, ceiling=CEILING, limits=["provider"])
    unlimited.register(name, _noop, ceiling=CEILING)
