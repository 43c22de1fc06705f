"""A shutdown's releases, read from slotd's log: did a claim that met a shutdown cost an attempt?

    python releases.py HARNESS_ERR [...]

A claim that meets a replica's shutdown before its handler starts is released with its
attempt given back (sql `release`, unstarted): its log line is `cancelled` with no duration.
Before that rule, each such release burnt an attempt of a task that never ran (the same task
released twice at one shutdown, attempt 1 then 2). This groups slotd's outcome lines by task
id, in time order, and lists every unstarted release whose next line for the same task
carries a higher attempt number (a SIGKILLed replica writes no line, so one such case can
also be a kill in between: read its events). Prints one JSON object."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from itertools import pairwise
from typing import Any

# "...Z INFO    slot 2 task bench.job#7199 attempt 1: success in 4.1ms  task_id=..."
OUTCOME = re.compile(
    r"^(?P<ts>\S+Z) \w+\s+.*?task (?P<type>\S+)#(?P<id>\d+) attempt (?P<attempt>\d+): "
    r"(?P<outcome>\w+)(?P<duration> in [\d.]+ms)?"
)

Event = tuple[str, int, str, bool]  # timestamp, attempt, outcome, started (has a duration)


def events_by_task(paths: list[str]) -> dict[int, list[Event]]:
    events: dict[int, list[Event]] = defaultdict(list)
    for path in paths:
        with open(path, errors="replace") as fh:
            for line in fh:
                m = OUTCOME.match(line)
                if m:
                    events[int(m["id"])].append(
                        (m["ts"], int(m["attempt"]), m["outcome"], m["duration"] is not None)
                    )
    for evs in events.values():
        evs.sort()
    return events


def unstarted(event: Event) -> bool:
    return event[2] == "cancelled" and not event[3]


def report(events: dict[int, list[Event]]) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    released: dict[int, list[tuple[str, int]]] = {}
    rising: dict[int, list[Event]] = {}
    for tid, evs in events.items():
        for e in evs:
            outcomes[e[2] + (" (unstarted)" if unstarted(e) else "")] += 1
        mine = [(e[0], e[1]) for e in evs if unstarted(e)]
        if len(mine) > 1:
            released[tid] = mine
        if any(unstarted(a) and b[1] > a[1] for a, b in pairwise(evs)):
            rising[tid] = evs
    return {
        "tasks_in_log": len(events),
        "outcomes": dict(outcomes),
        "unstarted_releases": outcomes["cancelled (unstarted)"],
        "released_unstarted_more_than_once": released,
        "unstarted_then_higher_attempt": rising,
    }


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: releases.py HARNESS_ERR [...]", file=sys.stderr)
        return 2
    print(json.dumps(report(events_by_task(sys.argv[1:])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
