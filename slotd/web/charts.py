"""The dashboard's charts as plain numbers for server-rendered SVG (the templates draw
rectangles, polylines and axes from them): no chart library and no script for a few hundred
points, nothing loaded from anywhere but the page itself.

Every chart has a y-axis with round ticks and its unit, and a time axis with clock labels.
Its window is the last hour by minute or the last day by hour, starting where the data does
(a replica started five minutes ago draws five minutes across the width, not a sliver at
the right edge of an hour), never narrower than a few buckets."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from slotd.outcome import Outcome
from slotd.web.formats import ago


@dataclass(frozen=True)
class Window:
    name: str  # what the page's ?window= says
    unit: str  # the SQL statements' date_trunc unit
    buckets: int
    step: timedelta
    least: int  # the fewest buckets drawn
    tick_spacings: tuple[int, ...]  # a time label every so many buckets, the first that fits
    label: str  # strftime of a time label
    per: str  # the rates' unit: attempts per min or per h
    title: str


HOUR = Window(
    "hour", "minute", 60, timedelta(minutes=1), 10, (1, 2, 5, 10, 15, 30), "%H:%M", "min",
    "last hour, by minute",
)  # fmt: skip
DAY = Window(
    "day", "hour", 24, timedelta(hours=1), 6, (1, 2, 3, 6, 12), "%H:00", "h",
    "last day, by hour",
)  # fmt: skip
WINDOWS = {w.name: w for w in (HOUR, DAY)}

# The drawing: a viewBox the SVG scales into the page's width (text scales with it, so
# the box is small enough for a phone's width to keep its labels legible).
WIDTH, HEIGHT = 480, 150
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 10, 22
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
MAX_TIME_LABELS = 6

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
# What the failure rate counts: attempts that ended badly (a cancel is an operator's).
FAILED = frozenset({Outcome.FAILURE, Outcome.TIMEOUT, Outcome.LOST, Outcome.CRASHED})


def window_named(name: str | None) -> Window:
    if not name:
        return HOUR
    if name not in WINDOWS:
        raise ValueError(f"bad window {name!r}: use hour or day")
    return WINDOWS[name]


def _truncate(moment: datetime, window: Window) -> datetime:
    moment = moment.astimezone(UTC).replace(second=0, microsecond=0)
    return moment.replace(minute=0) if window.unit == "hour" else moment


def frame(window: Window, first: datetime | None, now: datetime) -> tuple[datetime, int]:
    """The buckets drawn (first bucket, how many): from the first with data, no earlier
    than the window's start, at least `least` of them, to the current one."""
    end = _truncate(now, window)
    start = end - (window.buckets - 1) * window.step
    if first is not None:
        start = max(start, _truncate(first, window))
    start = min(start, end - (window.least - 1) * window.step)
    return start, int((end - start) / window.step) + 1


def scale(peak: float) -> tuple[float, list[float]]:
    """A round top at or above the peak, and the y-axis' ticks up to it (3 to 5)."""
    if peak <= 0:
        return 1.0, [0.0, 1.0]
    step = 1.0
    magnitude = 10.0 ** math.floor(math.log10(peak / 4)) if peak > 4 else 1.0
    for m in (1, 2, 5, 10):
        step = m * magnitude
        if peak / step <= 4:
            break
    top = math.ceil(peak / step - 1e-9) * step
    return top, [i * step for i in range(int(round(top / step)) + 1)]


def axes(
    window: Window, start: datetime, n: int, ticks: list[float], fmt: Callable[[float], str],
    unit: str,
) -> dict[str, Any]:  # fmt: skip
    """Where the gridlines and labels go, in the viewBox's units."""
    slot = PLOT_W / n
    top = ticks[-1] or 1.0
    spacing = next(
        (k for k in window.tick_spacings if n / k <= MAX_TIME_LABELS), window.tick_spacings[-1]
    )
    x_ticks = []
    for i in range(n):
        moment = start + i * window.step
        position = moment.hour if window.unit == "hour" else moment.hour * 60 + moment.minute
        if position % spacing == 0:
            x_ticks.append(
                {"x": round(LEFT + (i + 0.5) * slot, 1), "label": _clock(moment, window)}
            )
    y_ticks = [
        {"y": round(TOP + PLOT_H - value / top * PLOT_H, 1), "label": fmt(value)} for value in ticks
    ]
    end = start + (n - 1) * window.step
    return {
        "x": x_ticks,
        "y": y_ticks,
        "unit": unit,
        "left": LEFT,
        "right": LEFT + PLOT_W,
        "top": TOP,
        "bottom": TOP + PLOT_H,
        "width": WIDTH,
        "height": HEIGHT,
        "since": _clock(start, window),
        "until": _clock(end + window.step, window) + " UTC",
    }


def _clock(moment: datetime, window: Window) -> str:
    return moment.strftime(window.label)


def _count(value: float) -> str:
    return f"{value:g}" if value < 10_000 else f"{value / 1000:g}k"


def _first(rows: Iterable[dict[str, Any]]) -> datetime | None:
    return min((r["minute"] for r in rows), default=None)


def outcomes(
    rows: list[dict[str, Any]], window: Window = HOUR, now: datetime | None = None
) -> dict[str, Any]:
    """Attempts per bucket as stacked bars by outcome (rows: minute, outcome, count, of
    one type or all), with the y-axis in attempts per minute or per hour."""
    now = now or datetime.now(UTC)
    start, n = frame(window, _first(rows), now)
    per_bucket: dict[int, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for row in rows:
        index = int((_truncate(row["minute"], window) - start) / window.step)
        if 0 <= index < n:
            bucket = per_bucket.setdefault(index, {})
            bucket[row["outcome"]] = bucket.get(row["outcome"], 0) + int(row["count"])
            totals[row["outcome"]] = totals.get(row["outcome"], 0) + int(row["count"])
    peak = max((sum(b.values()) for b in per_bucket.values()), default=0)
    top, ticks = scale(peak)
    slot = PLOT_W / n
    bars = []
    for index, bucket in sorted(per_bucket.items()):
        y = float(TOP + PLOT_H)
        moment = _clock(start + index * window.step, window)
        for outcome, colour in OUTCOME_COLOURS.items():
            count = bucket.get(outcome, 0)
            if not count:
                continue
            height = PLOT_H * count / top
            y -= height
            bars.append(
                {
                    "x": round(LEFT + index * slot + slot * 0.1, 2),
                    "y": round(y, 2),
                    "width": round(max(slot * 0.8, 1.0), 2),
                    "height": round(max(height, 0.5), 2),
                    "colour": colour,
                    "title": f"{moment} {outcome}: {count}",
                }
            )
    total = sum(totals.values())
    failed = sum(n for o, n in totals.items() if o in FAILED)
    return {
        "bars": bars,
        "legend": [
            {"outcome": str(o), "colour": c, "count": totals.get(o, 0)}
            for o, c in OUTCOME_COLOURS.items()
        ],
        "axes": axes(window, start, n, ticks, _count, f"attempts / {window.per}"),
        "total": total,
        "peak": peak,
        "failed": failed,
        "failure_rate": _percent(failed, total),
        "window": window,
    }


SPARK_HEIGHT = 16


def per_type(
    rows: list[dict[str, Any]], window: Window = HOUR, now: datetime | None = None
) -> dict[str, dict[str, Any]]:
    """Each type's throughput (attempts per minute or hour, over the buckets drawn) and
    failure rate, with a sparkline of its own buckets (failed attempts on top, in red):
    the overview's types table, readable at a glance."""
    now = now or datetime.now(UTC)
    start, n = frame(window, _first(rows), now)
    tallies: dict[str, dict[int, list[int]]] = {}
    for row in rows:
        index = int((_truncate(row["minute"], window) - start) / window.step)
        if 0 <= index < n:
            pair = tallies.setdefault(row["task_type"], {}).setdefault(index, [0, 0])
            pair[1 if row["outcome"] in FAILED else 0] += int(row["count"])
    out = {}
    for task_type, buckets in tallies.items():
        total = sum(ok + bad for ok, bad in buckets.values())
        failed = sum(bad for _, bad in buckets.values())
        peak = max(ok + bad for ok, bad in buckets.values()) or 1
        spark = []
        for index, (ok, bad) in sorted(buckets.items()):
            whole = SPARK_HEIGHT * (ok + bad) / peak
            red = SPARK_HEIGHT * bad / peak
            spark.append(
                {"x": index, "y": round(SPARK_HEIGHT - whole, 2), "height": round(whole, 2),
                 "red": round(red, 2)}
            )  # fmt: skip
        out[task_type] = {
            "rate": f"{_rate(total / n)}/{window.per}",
            "total": total,
            "failed": failed,
            "failure_rate": _percent(failed, total),
            "bad": bool(total) and failed / total >= 0.1,
            "spark": spark,
            "spark_width": n,
            "spark_height": SPARK_HEIGHT,
        }
    return out


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _percent(part: int, whole: int) -> str:
    if not whole:
        return "–"
    share = 100 * part / whole
    return f"{share:.1f}%" if 0 < share < 10 else f"{share:.0f}%"


# Lines for the busiest types; the rest are summed into one, so the chart stays readable.
BACKLOG_LINES = 6
TYPE_COLOURS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f", "#757575")
METRICS = (
    ("pending", "Pending", "tasks"),
    ("running", "Running", "tasks"),
    ("oldest_due_s", "Oldest due", "wait"),
)


def backlog(
    rows: list[dict[str, Any]], window: Window = HOUR, now: datetime | None = None
) -> dict[str, Any]:
    """Pending, running and oldest due by type (rows: each bucket's highest sample): one
    small chart per measure with its own axes, a line per type (a bucket sampled without a
    type's row reads 0 for it)."""
    now = now or datetime.now(UTC)
    start, n = frame(window, _first(rows), now)
    by_type: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        index = int((_truncate(row["minute"], window) - start) / window.step)
        if 0 <= index < n:
            by_type.setdefault(row["task_type"], {})[index] = row
    busiest = sorted(by_type, key=lambda t: -max(r["pending"] for r in by_type[t].values()))
    shown, rest = busiest[:BACKLOG_LINES], busiest[BACKLOG_LINES:]
    series = [(t, TYPE_COLOURS[i % len(TYPE_COLOURS)], [by_type[t]]) for i, t in enumerate(shown)]
    if rest:
        series.append((f"{len(rest)} other types", TYPE_COLOURS[-1], [by_type[t] for t in rest]))
    sampled = sorted({i for samples in by_type.values() for i in samples})
    slot = PLOT_W / n
    charts = []
    for field, title, unit in METRICS:
        lines, peak = [], 0.0
        for name, colour, groups in series:
            values = [sum(float(g[i][field] or 0) for g in groups if i in g) for i in sampled]
            peak = max([peak, *values])
            lines.append((name, colour, values))
        top, ticks = scale(peak)
        fmt = ago if unit == "wait" else _count
        drawn = [
            {
                "name": name,
                "colour": colour,
                "points": " ".join(
                    f"{LEFT + (i + 0.5) * slot:.1f},{TOP + PLOT_H - v / top * PLOT_H:.1f}"
                    for i, v in zip(sampled, values, strict=True)
                ),
                "last": fmt(values[-1]) if values else "0",
            }
            for name, colour, values in lines
        ]
        axis_unit = "wait" if unit == "wait" else "tasks"
        if window.unit == "hour":
            axis_unit += " (peak of each hour)"
        charts.append(
            {
                "field": field,
                "title": title,
                "lines": drawn,
                "peak": fmt(peak),
                "axes": axes(window, start, n, ticks, fmt, axis_unit),
            }
        )
    return {
        "charts": charts,
        "legend": [{"name": n, "colour": c} for n, c, _ in series],
        "samples": len(sampled),
        "window": window,
    }
