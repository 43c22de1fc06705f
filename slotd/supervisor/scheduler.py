"""Periodic schedules, evaluated by every replica that declares them: no leader.

Each replica with schedules runs one thread (never the supervisor's loop) with its own
connection. It sleeps until the next fire time by the database's clock, plans what is due
from the durable rows (slotd.schedule.plan), and fires it with the one compare-and-set
statement that also inserts the tasks (schedules_fire): when two replicas plan the same fire
time, one advances the row and the other is refused and plans again from what the first
wrote. A replica with no schedules starts no thread, opens no connection and runs nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slotd import db
from slotd.logs import Repeats
from slotd.repository import Repository
from slotd.schedule import Plan, Schedule, lag_seconds, plan

log = logging.getLogger("slotd.schedules")

DECLARE_EVERY = 30.0  # seconds; a declaration unseen for a minute is no longer live
BACKOFF_CAP = 30.0
# Wake this long after a fire time, so the database's clock has passed it when the
# statement runs (the statement refuses a fire time in the database's future).
WAKE_MARGIN = 0.005
MAX_SLEEP = 60.0  # re-check at least this often: a clock estimate is only an estimate


@dataclass
class Row:
    anchor: datetime
    last: datetime | None
    # The row holds this replica's declaration: only then does it fire the schedule (a
    # newer declaration of the name, from another version of the application, won).
    ours: bool = True


@dataclass(frozen=True)
class Fired:
    """What one fire statement did for one schedule."""

    schedule: str
    fire_times: list[datetime]
    task_ids: list[int]

    @property
    def folded(self) -> int:
        """Fire times that enqueued nothing (overlap rule: the previous task was live)."""
        return len(self.fire_times) - len(self.task_ids)


class Evaluator:
    """The schedules one replica declares and what it last read of their rows.

    Shared by the daemon's thread and the pytest plugin's manual mode, which differ only in
    when they call `declare` and `fire_due` and which connection they pass."""

    def __init__(self, schedules: Sequence[Schedule], replica_id: str, max_attempts: int):
        self.schedules = {sc.name: sc for sc in schedules}
        self.replica_id = replica_id
        self.max_attempts = max_attempts
        # Seconds added to the database's clock: 0 in the daemon; the pytest plugin's
        # manual mode advances it instead of waiting.
        self.offset = 0.0
        self.rows: dict[str, Row] = {}
        # When (database clock) this evaluator first declared: its declarations' age, by
        # which the newest declaration of a name wins (schedules_declare).
        self.stamp: datetime | None = None
        # The database's clock, as last read, and the local monotonic instant it was read.
        self._db_at: datetime | None = None
        self._mono_at = 0.0
        self._lock = threading.Lock()  # the metrics collector reads rows from another thread

    # the database's clock

    def _saw_clock(self, db_now: datetime | None) -> None:
        if db_now is not None:
            self._db_at, self._mono_at = db_now, time.monotonic()

    @property
    def clock_read(self) -> datetime | None:
        """The database's clock as the last statement read it (manual mode plans on it:
        a transaction's now() stands still)."""
        return self._db_at

    def db_now(self) -> datetime | None:
        """The database's clock now, estimated from the last statement's now()."""
        if self._db_at is None:
            return None
        return self._db_at + timedelta(seconds=time.monotonic() - self._mono_at)

    @property
    def complete(self) -> bool:
        return len(self.rows) == len(self.schedules)

    # statements

    def declare(self, repo: Repository) -> None:
        rows, self.stamp, db_now = repo.declare_schedules(
            self.replica_id,
            socket.gethostname(),
            os.getpid(),
            list(self.schedules.values()),
            self.offset,
            self.stamp,
        )
        with self._lock:
            for name, anchor, last, ours, expression in rows:
                if anchor is None:
                    self.rows.pop(name, None)  # created by another replica just now
                    continue
                before = self.rows.get(name)
                self.rows[name] = Row(anchor, last, bool(ours))
                if not ours and (before is None or before.ours):
                    _log_superseded(self.schedules[name], expression)
        self._saw_clock(db_now)

    def plans(self, now: datetime) -> dict[str, Plan]:
        out = {}
        for name, row in self.rows.items():
            if not row.ours:
                continue
            due = plan(self.schedules[name], row.last, row.anchor, now)
            if due.due:
                out[name] = due
        return out

    def fire_due(self, repo: Repository, now: datetime | None = None) -> list[Fired]:
        """Fire what is due at `now` (default: the database's clock, estimated). A schedule
        another replica advanced first is re-planned from the row and tried again, so the
        call returns with nothing due that this replica knows of."""
        done: list[Fired] = []
        for _ in range(5):  # each retry follows a refusal that taught us the row's state
            at = now or self.db_now()
            if at is None:
                return done
            plans = self.plans(at)
            if not plans or not self._fire(repo, plans, done):
                return done
        return done

    def _fire(self, repo: Repository, plans: dict[str, Plan], done: list[Fired]) -> bool:
        names = sorted(plans)
        advances = [(self.schedules[n], self.rows[n].last, plans[n].new_last) for n in names]
        fires = [(self.schedules[n], at) for n in names for at in plans[n].fires]
        result = repo.fire_schedules(advances, fires, self.max_attempts, self.offset)  # type: ignore[arg-type]
        refused = False
        seen = set()
        with self._lock:
            for name, ours, declared, last, task_ids, db_now, expression in result:
                seen.add(name)
                self._saw_clock(db_now)
                self.rows[name].last = last
                if not declared:  # replaced since our last declare: stop firing it
                    self.rows[name].ours = False
                    _log_superseded(self.schedules[name], expression)
                elif ours:
                    done.append(Fired(name, plans[name].fires, task_ids))
                    _log_fire(name, plans[name], task_ids)
                else:
                    refused = True
            for name in set(names) - seen:
                self.rows.pop(name, None)  # the row is gone (pruned): declare again
        return refused

    # what the thread sleeps until, and what the metrics show

    def next_fire(self) -> datetime | None:
        times = [
            self.schedules[name].next_after(row.last or row.anchor)
            for name, row in self.rows.items()
            if row.ours
        ]
        return min(times) if times else None

    def snapshot(self) -> list[tuple[Schedule, Row]]:
        with self._lock:
            return [
                (self.schedules[n], Row(r.anchor, r.last)) for n, r in self.rows.items() if r.ours
            ]


def _log_superseded(schedule: Schedule, expression: str | None) -> None:
    held = f" ({expression})" if expression and expression != schedule.expression else ""
    log.warning(
        "schedule %s: another replica's newer declaration%s is in force; this replica does"
        " not fire its own (%s) unless that one's replicas are gone",
        schedule.name,
        held,
        schedule.expression,
        extra={"schedule": schedule.name},
    )


def _log_fire(name: str, due: Plan, task_ids: list[int]) -> None:
    fields = {"schedule": name, "fires": len(due.fires), "enqueued": len(task_ids)}
    if due.fires and not task_ids:
        log.info(
            "schedule %s: fire at %s folded into its previous task, still live",
            name,
            due.fires[-1].isoformat(),
            extra=fields,
        )
    elif len(due.fires) > len(task_ids) and len(task_ids) == 1:
        log.info(
            "schedule %s: %d fire times folded into one task, at %s (overlap skip)",
            name,
            len(due.fires),
            due.fires[-1].isoformat(),
            extra=fields,
        )
    elif len(due.fires) > 1:
        log.info("schedule %s: enqueued %d fire times", name, len(task_ids), extra=fields)
    elif not due.fires:
        log.info("schedule %s: missed fire times skipped (catch_up)", name, extra=fields)


class ScheduleThread(threading.Thread):
    """The replica's schedule evaluation: its own thread, its own connection, every
    statement bounded by the settings' statement and lock timeouts. The supervisor only
    starts it and asks it to stop; nothing here ever waits on the supervisor's loop."""

    def __init__(self, schedules: Sequence[Schedule], settings: Any, url: str, replica_id: str):
        super().__init__(name="slotd-schedules", daemon=True)
        self.settings = settings
        self.url = url
        self.evaluator = Evaluator(schedules, replica_id, settings.max_attempts)
        self._stop_event = threading.Event()
        self._repo: Repository | None = None
        self._next_declare = 0.0
        self.fired = 0  # fire statements that advanced a row: tests and logs read it

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    def run(self) -> None:
        backoff = 0.5
        repeats = Repeats()  # a database gone: its run of failures told in steps
        while not self._stop_event.is_set():
            try:
                self._step()
                backoff = 0.5
                repeats.ok()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any error
                if isinstance(exc, psycopg.Error):
                    log.log(
                        repeats.level(),
                        "schedules: %s; retrying in %.1fs",
                        db.first_line(exc),
                        backoff,
                    )
                else:
                    log.exception("schedules: evaluation failed; retrying in %.1fs", backoff)
                self._drop()
                self._stop_event.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
        self._goodbye()

    def _connection(self) -> Repository:
        if self._repo is None:
            prepare = self.settings.prepare
            conn = db.connect(self.url, role="slotd schedules", prepare=prepare)
            repo = Repository.from_settings(self.settings, conn)
            if db.session_is_ours(conn, prepare):
                repo.bind_session()  # as the chores': one statement per write, not two
            self._repo = repo
            self._next_declare = 0.0
        return self._repo

    def _step(self) -> None:
        repo = self._connection()
        ev = self.evaluator
        if time.monotonic() >= self._next_declare or not ev.complete:
            ev.declare(repo)
            self._next_declare = time.monotonic() + DECLARE_EVERY
            if not ev.complete:
                return  # a row created concurrently: declare again at once
        self.fired += len(ev.fire_due(repo))
        self._sleep()

    def _sleep(self) -> None:
        ev = self.evaluator
        wait = self._next_declare - time.monotonic()
        upcoming, now = ev.next_fire(), ev.db_now()
        if upcoming is not None and now is not None:
            wait = min(wait, (upcoming - now).total_seconds() + WAKE_MARGIN)
        self._stop_event.wait(min(max(wait, 0.0), MAX_SLEEP))

    def _drop(self) -> None:
        repo, self._repo = self._repo, None
        if repo is not None:
            try:
                repo.write.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail too
                pass

    def _goodbye(self) -> None:
        try:
            if self._repo is not None:
                self._repo.schedules_gone(self.evaluator.replica_id)
        except psycopg.Error:
            pass  # the declaration simply expires after a minute
        self._drop()

    def collector(self) -> Collector:
        return ScheduleCollector(self.evaluator)


class ScheduleCollector(Collector):
    """Per-schedule gauges from what this replica last read of the rows. Lag is computed at
    scrape time, so a replica whose evaluation is stuck shows it growing (the alert takes
    the minimum over replicas: the schedule is late only if nobody fires it)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "slotd_schedule_last_fire_timestamp_seconds", "", labels=["schedule"]
        )
        yield GaugeMetricFamily("slotd_schedule_lag_seconds", "", labels=["schedule"])
        yield GaugeMetricFamily("slotd_schedule_period_seconds", "", labels=["schedule"])

    def collect(self) -> Iterator[Metric]:
        last = GaugeMetricFamily(
            "slotd_schedule_last_fire_timestamp_seconds",
            "Unix time of the schedule's latest fire time dealt with by the fleet",
            labels=["schedule"],
        )
        lag = GaugeMetricFamily(
            "slotd_schedule_lag_seconds",
            "Seconds since the schedule's oldest fire time not yet fired (0: on time)",
            labels=["schedule"],
        )
        period = GaugeMetricFamily(
            "slotd_schedule_period_seconds",
            "The schedule's current period (for cron: the gap between its next two fires)",
            labels=["schedule"],
        )
        now = self.evaluator.db_now()
        for schedule, row in self.evaluator.snapshot():
            if row.last is not None:
                last.add_metric([schedule.name], row.last.timestamp())
            if now is not None:
                lag.add_metric([schedule.name], lag_seconds(schedule, row.last, row.anchor, now))
                base = row.last or row.anchor
                period.add_metric([schedule.name], schedule.period_after(base).total_seconds())
        yield last
        yield lag
        yield period


def start(
    schedules: Sequence[Schedule], settings: Any, url: str, replica_id: str, metrics: Any
) -> ScheduleThread:
    """Schedule evaluation runs in a thread of its own, on its own connection: the
    supervisor's loop never waits for it. `metrics`: the replica's, or None."""
    thread = ScheduleThread(schedules, settings, url, replica_id)
    if metrics is not None:
        metrics.registry.register(thread.collector())
    thread.start()
    # The supervisor's line: an operator reads it among the replica's start-up lines.
    logging.getLogger("slotd.supervisor").info(
        "evaluating %d schedule(s): %s",
        len(schedules),
        ", ".join(sc.name for sc in schedules),
    )
    return thread
