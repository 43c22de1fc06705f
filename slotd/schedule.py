"""Periodic schedules: what a declaration means, and which fire times are due when.

Pure: no database, no clock of its own. Every function takes the instants it reasons about,
so the fleet's evaluation (slotd.scheduler), the pytest plugin and the tests compute the
same fire times from the same inputs -- the database's clock and the schedule's durable row.

Fire times are absolute instants that every replica derives alike, with no state of its own:
- `every=` fires at whole multiples of the period since the Unix epoch (UTC): every=5m at
  :00, :05, ...; every=1s on each whole second. Deterministic, so two replicas (or one that
  restarted) always agree on which instant is "the next one".
- `cron=` is evaluated in the schedule's time zone by cronsim, with cron's DST rules: a
  local time that does not exist (spring forward) fires once at the next valid instant, a
  local time that repeats (fall back) fires once (its first occurrence); expressions that
  step through the hour (`*/30 * * * *`) keep firing on real time through both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

CATCH_UP = ("skip", "latest", "all")
OVERLAP = ("skip", "allow")
# A due fire time younger than this is late, not missed: it is always enqueued, whatever
# the catch-up policy, so a slow evaluation, a database blip or a rolling update never
# drops or folds work. Older ones fell due while no replica could fire them.
LATE_GRACE = timedelta(seconds=10)
# catch_up="all" enqueues missed fire times of at most the last day, and at most this many
# (the most recent), so a fleet that was down for a month does not flood the queue.
CATCH_UP_WINDOW = timedelta(days=1)
CATCH_UP_MAX = 1000
# Below a second the evaluation itself (one statement per fire) would be the workload.
MIN_EVERY = timedelta(seconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError:
        raise ImportError(
            "cron schedules need the cronsim package: pip install 'slotd[cron]'"
        ) from None
    return cronsim


@dataclass(frozen=True)
class Schedule:
    """One declared schedule (see Registry.schedule). Instants in and out are aware UTC."""

    name: str
    task_type: str
    cron: str | None
    every: timedelta | None
    payload: dict[str, Any]
    timezone: str
    catch_up: str
    overlap: str
    zone: ZoneInfo = field(compare=False, repr=False)

    @property
    def expression(self) -> str:
        """What operators read: the cron expression, or `every <seconds>s`."""
        if self.cron is not None:
            return self.cron
        assert self.every is not None
        return f"every {self.every.total_seconds():g}s"

    @property
    def payload_json(self) -> str:
        return json.dumps(self.payload, sort_keys=True)

    @property
    def fingerprint(self) -> str:
        """A digest of the whole declaration: which declaration a schedule's row holds (two
        versions of an application declaring one name differ here)."""
        body = [self.task_type, self.expression, self.timezone, self.catch_up, self.overlap]
        text = json.dumps([*body, self.payload], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def key_for(self, fire_at: datetime) -> str:
        """Task.key of the task for `fire_at`: the schedule's name and the instant."""
        stamp = fire_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"schedule:{self.name}:{stamp}"

    # fire times

    def next_after(self, t: datetime) -> datetime:
        """The first fire time strictly after `t`."""
        if self.every is not None:
            step = self.every // _US
            k = (t - EPOCH) // _US // step + 1
            return EPOCH + k * step * _US
        cron = _cronsim().CronSim(self.cron, t.astimezone(self.zone))
        return next(cron).astimezone(UTC)

    def last_at_or_before(self, t: datetime) -> datetime:
        """The most recent fire time at or before `t`."""
        if self.every is not None:
            step = self.every // _US
            k = (t - EPOCH) // _US // step
            return EPOCH + k * step * _US
        cron = _cronsim().CronSim(self.cron, (t + _US).astimezone(self.zone), reverse=True)
        return next(cron).astimezone(UTC)

    def fire_times(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Fire times in (after, until], oldest first; the most recent `limit` of them."""
        if until <= after:
            return []
        if self.every is not None:
            last = self.last_at_or_before(until)
            out = []
            while last > after and len(out) < limit:
                out.append(last)
                last -= self.every
            return out[::-1]
        found: list[datetime] = []
        cron = _cronsim().CronSim(self.cron, (until + _US).astimezone(self.zone), reverse=True)
        for local in cron:
            fire = local.astimezone(UTC)
            if fire <= after or len(found) >= limit:
                break
            found.append(fire)
        return found[::-1]

    def period_after(self, t: datetime) -> timedelta:
        """The gap between the fire time after `t` and the one after that (a cron's
        period varies; this is the one in force)."""
        if self.every is not None:
            return self.every
        first = self.next_after(t)
        return self.next_after(first) - first


@dataclass(frozen=True)
class Plan:
    """What one evaluation of a schedule does: enqueue `fires` (oldest first) and move
    the durable row to `new_last` (the latest due fire time, enqueued or not)."""

    fires: list[datetime]
    new_last: datetime | None
    next_fire: datetime

    @property
    def due(self) -> bool:
        return self.new_last is not None


def plan(schedule: Schedule, last: datetime | None, anchor: datetime, now: datetime) -> Plan:
    """The fire times due at database time `now`, given the row's last fire (None: never
    fired; the first fire is then the first fire time after the row's `anchor`).

    Late fire times (younger than LATE_GRACE) are always enqueued. Missed ones follow the
    catch-up policy: skip enqueues none of them, latest only the most recent, all each one
    of the window (CATCH_UP_WINDOW, at most CATCH_UP_MAX), oldest first."""
    base = last or anchor
    first = schedule.next_after(base)
    if first > now:
        return Plan([], None, first)
    newest = schedule.last_at_or_before(now)
    late_from = max(base, now - LATE_GRACE)
    late = schedule.fire_times(late_from, now, CATCH_UP_MAX)
    missed: list[datetime] = []
    if first <= now - LATE_GRACE:  # something fell due while no replica could fire it
        if schedule.catch_up == "latest":
            missed = [schedule.last_at_or_before(late_from)]
        elif schedule.catch_up == "all":
            since = max(base, now - CATCH_UP_WINDOW)
            missed = schedule.fire_times(since, late_from, CATCH_UP_MAX)
    fires = (missed + late)[-CATCH_UP_MAX:]
    return Plan(fires, newest, schedule.next_after(newest))


def lag_seconds(
    schedule: Schedule, last: datetime | None, anchor: datetime, now: datetime
) -> float:
    """How late the schedule is: seconds since its oldest unfired fire time (0: on time)."""
    first = schedule.next_after(last or anchor)
    return max((now - first).total_seconds(), 0.0)


# declaration


def _zone(name: str, label: str) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ValueError(f"schedule {label!r}: timezone must be an IANA zone name like 'UTC'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"schedule {label!r}: unknown time zone {name!r}") from None


def _check_cron(expr: object, label: str) -> str:
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(
            f"schedule {label!r}: cron must be a 5-field expression like '0 3 * * *', not {expr!r}"
        )
    cronsim = _cronsim()
    try:
        cronsim.CronSim(expr, datetime.now(UTC))
    except cronsim.CronSimError as exc:
        raise ValueError(f"schedule {label!r}: invalid cron expression {expr!r}: {exc}") from None
    return " ".join(expr.split())


def build(
    name: str,
    *,
    task_type: str,
    cron: str | None,
    every: timedelta | None,
    payload: Mapping[str, Any] | None,
    timezone: str,
    catch_up: str,
    overlap: str,
) -> Schedule:
    """A validated Schedule; bad input raises ValueError naming the schedule."""
    if (cron is None) == (every is None):
        raise ValueError(f"schedule {name!r}: give exactly one of cron= or every=")
    zone = _zone(timezone, name)
    if every is not None:
        if not isinstance(every, timedelta) or every < MIN_EVERY:
            raise ValueError(f"schedule {name!r}: every= must be a timedelta of at least 1s")
        if every % _US:
            raise ValueError(f"schedule {name!r}: every= must be whole microseconds")
    else:
        cron = _check_cron(cron, name)
    if catch_up not in CATCH_UP:
        raise ValueError(f"schedule {name!r}: catch_up must be one of {', '.join(CATCH_UP)}")
    if overlap not in OVERLAP:
        raise ValueError(f"schedule {name!r}: overlap must be one of {', '.join(OVERLAP)}")
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise ValueError(f"schedule {name!r}: payload must be a JSON object (a dict)")
    try:
        body = json.loads(json.dumps(dict(payload), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"schedule {name!r}: payload is not JSON-serializable: {exc}") from None
    return Schedule(name, task_type, cron, every, body, timezone, catch_up, overlap, zone)


def from_row(name: str, task_type: str, expression: str, timezone: str, catch_up: str) -> Schedule:
    """A schedule as its row describes it (`slotd schedules` has no registry to ask).
    Raises ValueError when the row cannot be evaluated here (e.g. cronsim is missing)."""
    every = None
    cron: str | None = expression
    if expression.startswith("every ") and expression.endswith("s"):
        every, cron = timedelta(seconds=float(expression[6:-1])), None
    try:
        return build(
            name,
            task_type=task_type,
            cron=cron,
            every=every,
            payload=None,
            timezone=timezone,
            catch_up=catch_up if catch_up in CATCH_UP else "latest",
            overlap="skip",
        )
    except ImportError as exc:
        raise ValueError(str(exc)) from None
