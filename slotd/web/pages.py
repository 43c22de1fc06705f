"""What each page shows, read through the repository's dashboard statements. Plain data
in, plain data out: the templates only lay it out."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from slotd.outcome import Outcome
from slotd.repository import DashboardReads

CHART_MINUTES = 60
CHART_HEIGHT = 80
# One colour per outcome, readable on white; the legend repeats the names.
OUTCOME_COLOURS = {
    Outcome.SUCCESS: "#2e7d32",
    Outcome.CONTINUED: "#81c784",
    Outcome.FAILURE: "#c62828",
    Outcome.TIMEOUT: "#ef6c00",
    Outcome.CANCELLED: "#757575",
    Outcome.LOST: "#6a1b9a",
    Outcome.CRASHED: "#ad1457",
}


def overview(reads: DashboardReads) -> dict[str, Any]:
    types = reads.types()
    counts = reads.counts(types)
    replicas = reads.replicas()
    served = {t for r in replicas for t in r["task_types"]}
    paused = _paused_types(reads)
    limits = _limits(replicas)
    rows = []
    for row in counts:
        has_work = row["pending"] or row["running"]
        rows.append(
            {
                **row,
                "capped": {k: row[k] >= reads.COUNT_CAP for k in ("pending", "running", "dead")},
                "unserved": bool(has_work) and row["task_type"] not in served,
                "paused": paused.get(row["task_type"]),
                "limit": limits.get(row["task_type"]),
            }
        )
    return {
        "types": rows,
        "cap": reads.COUNT_CAP,
        "replicas": replicas,
        "slots": sum(r["slots"] for r in replicas),
        "chart": chart(reads.outcomes()),
        "paused_known": bool(paused),
        "limits_known": bool(limits),
    }


def _paused_types(reads: DashboardReads) -> dict[str, str]:
    """The types `slotd pause` holds now (the same statement as `slotd status`)."""
    out = {}
    for row in reads.paused():
        until = row["until"]
        out[row["task_type"]] = (
            "until " + until.strftime("%Y-%m-%d %H:%M UTC") if until else "paused"
        )
    return out


def _limits(replicas: list[dict[str, Any]]) -> dict[str, str]:
    """Concurrency limits as replicas declare them (slotd_replicas.limits, where present:
    {"type": [max_running, max_running_per_group]})."""
    out: dict[str, str] = {}
    for replica in replicas:
        for task_type, pair in (replica.get("limits") or {}).items():
            total, per_group = (list(pair) + [None, None])[:2]
            parts = [
                f"{total} running" if total else "",
                f"{per_group} per group" if per_group else "",
            ]
            out.setdefault(task_type, ", ".join(p for p in parts if p))
    return out


def chart(rows: list[dict[str, Any]], now: datetime | None = None) -> dict[str, Any]:
    """A stacked bar per minute of the last hour, as SVG rectangles (no chart library for
    sixty bars)."""
    now = now or datetime.now(UTC)
    end = now.replace(second=0, microsecond=0)
    start = end - timedelta(minutes=CHART_MINUTES - 1)
    per_minute: dict[int, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for row in rows:
        index = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            bucket = per_minute.setdefault(index, {})
            bucket[row["outcome"]] = bucket.get(row["outcome"], 0) + int(row["count"])
            totals[row["outcome"]] = totals.get(row["outcome"], 0) + int(row["count"])
    peak = max((sum(b.values()) for b in per_minute.values()), default=0)
    bars = []
    for index, bucket in sorted(per_minute.items()):
        y = CHART_HEIGHT
        for outcome in OUTCOME_COLOURS:
            n = bucket.get(outcome, 0)
            if not n:
                continue
            height = max(CHART_HEIGHT * n / peak, 1.0)
            y -= height
            minute = (start + timedelta(minutes=index)).strftime("%H:%M")
            bars.append(
                {
                    "x": index * 10,
                    "y": round(y, 2),
                    "height": round(height, 2),
                    "colour": OUTCOME_COLOURS[outcome],
                    "title": f"{minute} {outcome}: {n}",
                }
            )
    legend = [
        {"outcome": str(o), "colour": c, "count": totals.get(o, 0)}
        for o, c in OUTCOME_COLOURS.items()
    ]
    return {
        "bars": bars,
        "legend": legend,
        "peak": peak,
        "height": CHART_HEIGHT,
        "width": CHART_MINUTES * 10,
        "total": sum(totals.values()),
    }


def running(reads: DashboardReads, lease_margin: timedelta) -> list[dict[str, Any]]:
    rows = reads.running(lease_margin)
    for row in rows:
        now = row["db_now"]
        row["remaining_s"] = (row["deadline"] - now).total_seconds()
        row["overdue"] = row["remaining_s"] < 0
        row["deadline_ms"] = int(row["deadline"].timestamp() * 1000)
        row["now_ms"] = int(now.timestamp() * 1000)
    return rows


def task(reads: DashboardReads, task_id: int) -> dict[str, Any] | None:
    row = reads.task(task_id)
    if row is None:
        return None
    row["payload_text"] = json.dumps(row["payload"], indent=2, sort_keys=True)
    row["state"] = (
        "dead"
        if row["dead"]
        else "running"
        if row["running"]
        else "due"
        if row["due"]
        else "waiting"
    )
    return row


def last_line(text: str | None, width: int = 160) -> str:
    if not text or not text.strip():
        return ""
    line = text.strip().splitlines()[-1]
    return line if len(line) <= width else line[: width - 1] + "…"


def dead(
    reads: DashboardReads, task_type: str | None, query: str | None, limit: int = 100
) -> dict[str, Any]:
    types = reads.types()
    ids: list[int] | None = None
    key = None
    if query:
        query = query.strip()
        if query.isdigit():
            ids = [int(query)]
        else:
            key = query
    rows = reads.dead_list(task_type, ids=ids, key=key, key_types=types, limit=limit)
    if ids and not rows:
        # "123" may be a key too: an id that names no dead letter is searched as one.
        rows = reads.dead_list(task_type, key=query, key_types=types, limit=limit)
    for row in rows:
        row["error_line"] = last_line(row["last_error"])
    total = len(rows) if query else reads.dead_count(task_type)
    return {
        "rows": rows,
        "types": types,
        "total": total,
        "capped": total >= reads.COUNT_CAP,
        "limit": limit,
    }


def schedules(reads: DashboardReads) -> dict[str, Any]:
    out: dict[str, Any] = {"paused": _table(reads.paused())}
    # Schedules are shown once the database has their table (a migration of their own).
    out["schedules"] = _schedules(reads) if "slotd_schedules" in reads.tables() else None
    return out


def _schedules(reads: DashboardReads) -> dict[str, Any]:
    # Next fire and lag computed as `slotd schedules` computes them: one definition.
    from slotd.commands.schedules import _report

    rows = []
    for row in map(_report, reads.schedules()):
        declared = ", ".join(f"{d['hostname']}:{d['pid']}" for d in row["declared_by"])
        rows.append(
            {
                "name": row["name"],
                "task type": row["task_type"],
                "when": f"{row['expression']} ({row['timezone']})",
                "catch up": row["catch_up"],
                "last fire": _stamp(row["last_fire"]),
                "next fire": _stamp(row["next_fire"]),
                "lag": None if row["lag_seconds"] is None else f"{row['lag_seconds']:.0f}s",
                "declared by": declared or "nobody (orphaned)",
            }
        )
    return _table(rows)


def _stamp(value: datetime | None) -> str | None:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z") if value is not None else None


def _table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    return {"rows": rows, "columns": columns}
