"""The dashboard's charts as plain numbers for server-rendered SVG (rectangles and
polylines in the templates): no chart library and no script for a few hundred points, and
nothing loaded from anywhere but the page itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slotd.outcome import Outcome
from slotd.web.formats import ago

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


def outcomes(rows: list[dict[str, Any]], now: datetime | None = None) -> dict[str, Any]:
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


BACKLOG_WIDTH = 720
BACKLOG_HEIGHT = 70
# Lines for the busiest types; the rest are summed into one, so the chart stays readable.
BACKLOG_LINES = 6
TYPE_COLOURS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f", "#757575")
METRICS = (
    ("pending", "Pending", "count"),
    ("running", "Running", "count"),
    ("oldest_due_s", "Oldest due", "seconds"),
)


def backlog(rows: list[dict[str, Any]], hours: int, now: datetime | None = None) -> dict[str, Any]:
    """Pending, running and oldest due by type over the last `hours` hours: one small chart
    per measure, a line per type (a minute the sample found no work for a type reads 0)."""
    now = now or datetime.now(UTC)
    end = now.replace(second=0, microsecond=0)
    minutes = hours * 60
    start = end - timedelta(minutes=minutes - 1)
    by_type: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        index = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= index < minutes:
            by_type.setdefault(row["task_type"], {})[index] = row
    busiest = sorted(by_type, key=lambda t: -max(r["pending"] for r in by_type[t].values()))
    shown, rest = busiest[:BACKLOG_LINES], busiest[BACKLOG_LINES:]
    series = [(t, TYPE_COLOURS[i % len(TYPE_COLOURS)], [by_type[t]]) for i, t in enumerate(shown)]
    if rest:
        series.append((f"{len(rest)} other types", TYPE_COLOURS[-1], [by_type[t] for t in rest]))
    sampled = sorted({i for samples in by_type.values() for i in samples})
    charts = []
    for field, title, unit in METRICS:
        lines, peak = [], 0.0
        for name, colour, groups in series:
            values = [sum(float(g[i][field] or 0) for g in groups if i in g) for i in sampled]
            peak = max([peak, *values])
            lines.append((name, colour, values))
        scale = BACKLOG_HEIGHT / peak if peak else 0.0
        step = BACKLOG_WIDTH / max(minutes - 1, 1)
        drawn = [
            {
                "name": name,
                "colour": colour,
                "points": " ".join(
                    f"{i * step:.1f},{BACKLOG_HEIGHT - v * scale:.1f}"
                    for i, v in zip(sampled, values, strict=True)
                ),
                "last": values[-1] if values else 0,
            }
            for name, colour, values in lines
        ]
        charts.append(
            {
                "field": field,
                "title": title,
                "lines": drawn,
                "peak": ago(peak) if unit == "seconds" else f"{int(peak)}",
            }
        )
    return {
        "charts": charts,
        "legend": [{"name": n, "colour": c} for n, c, _ in series],
        "width": BACKLOG_WIDTH,
        "height": BACKLOG_HEIGHT,
        "hours": hours,
        "samples": len(sampled),
        "since": start.strftime("%H:%M"),
        "until": end.strftime("%H:%M UTC"),
    }
