"""How the dashboard writes times and durations: for a person, not a database (no
microseconds, no raw seconds), the same on every page."""

from __future__ import annotations

from datetime import UTC, datetime


def ago(seconds: float | None) -> str:
    """A coarse age, for tables: 45s, 12m, 3h, 2d."""
    if seconds is None:
        return "–"
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def duration(seconds: float | None) -> str:
    """A span to the second, largest units first: 45s, 3m 05s, 2h 10m, 3d 4h."""
    if seconds is None:
        return "–"
    total = max(int(round(seconds)), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def stamp(value: datetime | None) -> str:
    """A moment, in UTC, to the second."""
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(seconds: float) -> str:
    """How far a moment is from now: 'in 3m 05s' or '12s ago'."""
    return f"in {duration(seconds)}" if seconds > 0 else f"{duration(-seconds)} ago"


def size(count: int | None) -> str:
    """A number of bytes: 312 B, 4.1 kB, 2.3 MB."""
    if count is None:
        return "–"
    for unit in ("B", "kB", "MB"):
        if count < 1000 or unit == "MB":
            return f"{count} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count = count / 1000  # type: ignore[assignment]
    return f"{count} B"  # unreachable: MB returns above


FILTERS = {
    "ago": ago,
    "duration": duration,
    "stamp": stamp,
    "relative": relative,
    "size": size,
}
