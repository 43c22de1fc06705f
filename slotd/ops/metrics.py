"""Prometheus metrics, kept in the supervisor process only.

Slots and runners do not touch prometheus_client: they send what happened to the supervisor
over their pipes and the supervisor calls `Metrics.record_*`. A slot that is killed has then
either delivered a message (counted once, here) or not (never counted), so nothing it already
reported can be lost or doubled, and there is no multiprocess directory to clean up.

The fleet gauges (pending, running, dead, oldest due) describe the table, not this replica, so
they come from one query (`gauges` in sql/queries.sql) run at most once per `ttl` however many
scrapers ask, through a custom collector: a type whose rows are gone simply stops being
exported, and `slotd_tasks_running` has no series at all while nothing runs (the starvation
alert's `or vector(0)` guard depends on that shape).

The HTTP endpoints that serve them (/metrics, /healthz, /readyz) are metrics_server.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slotd import db
from slotd.outcome import Outcome
from slotd.repository import Limits, Repository, execute
from slotd.supervisor.horizon import Holder

log = logging.getLogger("slotd.metrics")

OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
# Pre-initialised so rate() and increase() see a zero before the first event.
RESTART_REASONS = ("runner_crashed", "runner_killed", "slot_died", "runner_recycled")
FAULT_KINDS = ("error", "latency", "crash", "lost_settlement")

# A handler runs from about a millisecond (a no-op audit) to its ceiling (an hour for
# prefix_delete); roughly 2.5x steps keep the quantile error bounded across that range.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
# Due -> start: a woken slot starts within milliseconds, the poll backstop within 5 s, and
# a saturated fleet takes minutes to hours; the tail buckets are what starvation looks like.
START_DELAY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
)  # fmt: skip

GaugeSource = Callable[[], dict[str, Any]]


class DbGaugeSource:
    """Runs the `gauges` statement on one long-lived connection of its own.

    Errors propagate to the caller (the collector reports them as a failed refresh) after
    the connection is dropped, so the next refresh reconnects instead of reusing a broken
    session. Each refresh is one transaction with SET LOCAL timeouts, which stays correct
    behind a transaction-mode pooler."""

    def __init__(
        self,
        url: str,
        *,
        statement_timeout: timedelta = timedelta(seconds=5),
        connect_timeout: int = 3,
        limits: Limits | None = None,
        priority_step: timedelta = timedelta(seconds=1),
        prepare: str = "auto",
    ) -> None:
        self._url = url
        # This replica's limits: work held back only by them is not "waiting" (oldest due).
        self._limits = dict(limits or {})
        self._priority_step = priority_step
        self._connect_timeout = connect_timeout
        self._prepare = prepare
        # Shorter than Prometheus's default 10 s scrape timeout, so a slow primary shows
        # up as a failed refresh rather than a scrape that never answers.
        self._bounds = {
            "statement_timeout": f"{int(statement_timeout.total_seconds() * 1000)}ms",
            "lock_timeout": "1000ms",
        }
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> dict[str, Any]:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = db.connect(
                        self._url,
                        role="slotd metrics",
                        connect_timeout=self._connect_timeout,
                        prepare=self._prepare,
                    )
                conn = self._conn
                with conn.transaction():
                    execute(conn, "bound", self._bounds)
                    execute(conn, "gauges_serial")
                    repo = Repository(conn, priority_step=self._priority_step)
                    return repo.gauges(self._limits)
            except Exception:
                self._drop()
                raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection may itself fail; it is gone
                pass

    def close(self) -> None:
        with self._lock:
            self._drop()


def db_gauge_source(url: str, **kwargs: Any) -> DbGaugeSource:
    """The gauge source for `Metrics`: one connection, reconnecting after any error.
    Pass the read replica's URL where there is one; the gauges tolerate replica lag."""
    return DbGaugeSource(url, **kwargs)


class _FleetCollector(Collector):
    """The table's gauges, refreshed at most once per ttl and shared by concurrent scrapes."""

    def __init__(
        self,
        source: GaugeSource,
        ttl: float,
        max_stale: float,
        default_types: Iterable[str],
        clock: Callable[[], float],
    ) -> None:
        self._source = source
        self._ttl = ttl
        self._max_stale = max_stale
        self._default_types = tuple(default_types)
        self._clock = clock
        self._lock = threading.Lock()
        self._attempted_at: float | None = None  # monotonic, success or not
        self._good: dict[str, Any] | None = None
        self._good_at: float | None = None  # monotonic
        self._good_wall: float = 0.0  # unix time, exported
        self._last_ok = False
        self._last_seconds = 0.0
        self._errors = 0

    def describe(self) -> Iterator[Metric]:
        # Names only: registering must not query the database.
        yield GaugeMetricFamily("slotd_tasks_pending", "", labels=["task_type"])
        yield GaugeMetricFamily("slotd_tasks_running", "", labels=["task_type"])
        yield GaugeMetricFamily("slotd_tasks_dead", "", labels=["task_type"])
        yield GaugeMetricFamily("slotd_task_oldest_due_seconds", "")
        yield GaugeMetricFamily("slotd_task_type_paused", "", labels=["task_type"])
        yield GaugeMetricFamily("slotd_gauges_up", "")
        yield GaugeMetricFamily("slotd_gauges_last_success_timestamp_seconds", "")
        yield GaugeMetricFamily("slotd_gauges_refresh_seconds", "")
        yield CounterMetricFamily("slotd_gauges_refresh_errors", "")

    def _refresh(self) -> None:
        now = self._clock()
        # A failed refresh is cached too: a down primary must not be hammered by every
        # scrape, nor make every scrape wait out a connect timeout.
        if self._attempted_at is not None and now - self._attempted_at < self._ttl:
            return
        started = time.perf_counter()
        try:
            values = self._source()
        except Exception as exc:
            self._last_ok = False
            self._errors += 1
            log.warning("fleet gauges refresh failed: %s", db.redact(str(exc).strip() or repr(exc)))
        else:
            self._good, self._good_at, self._good_wall = values, now, time.time()
            self._last_ok = True
        self._last_seconds = time.perf_counter() - started
        self._attempted_at = self._clock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._refresh()
            good, good_at = self._good, self._good_at
            ok, seconds, errors, wall = (
                self._last_ok,
                self._last_seconds,
                self._errors,
                self._good_wall,
            )
            fresh = good_at is not None and self._clock() - good_at <= self._max_stale
        if good is not None and fresh:
            yield from self._families(good)
        yield GaugeMetricFamily(
            "slotd_gauges_up",
            "1 when the last refresh of the fleet gauges from the database succeeded",
            value=1.0 if ok else 0.0,
        )
        yield GaugeMetricFamily(
            "slotd_gauges_last_success_timestamp_seconds",
            "Unix time of the last successful fleet gauge refresh (0: never)",
            value=wall,
        )
        yield GaugeMetricFamily(
            "slotd_gauges_refresh_seconds",
            "How long the last fleet gauge refresh took",
            value=seconds,
        )
        yield CounterMetricFamily(
            "slotd_gauges_refresh_errors",
            "Fleet gauge refreshes that failed",
            value=float(errors),
        )

    def _families(self, values: dict[str, Any]) -> Iterator[Metric]:
        helps = {
            "pending": "Unfinished tasks: retryable, or on their final attempt under a live lease",
            "running": "Tasks under a live lease (a subset of pending)",
            "dead": "Dead letters: out of attempts and not held by a worker",
        }
        for kind, help_text in helps.items():
            family = GaugeMetricFamily(f"slotd_tasks_{kind}", help_text, labels=["task_type"])
            by_type: dict[str, float] = dict(values.get(kind) or {})
            if kind != "running":
                # A zero for this replica's own types lets a dead-letter increase from
                # nothing register; `running` stays absent when idle (see module doc).
                for task_type in self._default_types:
                    by_type.setdefault(task_type, 0)
            for task_type in sorted(by_type):
                family.add_metric([task_type], float(by_type[task_type]))
            yield family
        yield GaugeMetricFamily(
            "slotd_task_oldest_due_seconds",
            "How long the longest-waiting claimable task has been due (0 when none)",
            value=float(values.get("oldest_due_seconds") or 0.0),
        )
        # 1 for a paused type (fleet-wide, like the other table gauges), 0 for this
        # replica's own types otherwise: the alerts leave paused types out with it.
        paused = GaugeMetricFamily(
            "slotd_task_type_paused",
            "1 while claims of the task type are paused (slotd pause), else 0",
            labels=["task_type"],
        )
        flags = {t: 0.0 for t in self._default_types}
        flags.update({t: 1.0 for t in values.get("paused") or {}})
        for task_type in sorted(flags):
            paused.add_metric([task_type], flags[task_type])
        yield paused
        yield from _rate_families(values.get("rates") or {})


# Rate windows (sql/022) as the gauges read them: name, help, the field of each type's
# window (slotd.repository's gauges()["rates"]).
RATE_GAUGES = (
    ("slotd_task_rate_starts", "Starts of the task type in its current rate window", "used"),
    ("slotd_task_rate_allowed", "Starts the task type's rate allows per window", "allowed"),
    ("slotd_task_rate_window_seconds", "The length of the task type's rate window", "window_s"),
    (
        "slotd_task_rate_next_free_seconds",
        "Seconds until the task type's rate window has room for a start (0: now)",
        "free_s",
    ),
    (
        "slotd_task_rate_groups_full",
        "Groups of the task type whose rate_per_group window is full right now",
        "groups_full",
    ),
)


def _rate_families(rates: dict[str, dict[str, float]]) -> Iterator[Metric]:
    for name, help_text, field in RATE_GAUGES:
        family = GaugeMetricFamily(name, help_text, labels=["task_type"])
        for task_type in sorted(rates):
            if field in rates[task_type]:
                family.add_metric([task_type], rates[task_type][field])
        yield family


class Metrics:
    """Every slotd metric of one replica, in a registry of its own."""

    def __init__(
        self,
        slots: int,
        task_types: list[str],
        gauge_source: GaugeSource | None,
        ttl: float = 5.0,
        *,
        max_stale: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        limits: Limits | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.task_types = list(task_types)
        reg = self.registry

        self._slots = Gauge("slotd_task_slots", "Worker slots of this replica", registry=reg)
        self._slots.set(slots)
        self._handlers = Gauge(
            "slotd_replica_handlers",
            "1 for each task type this replica has a handler for",
            ["task_type"],
            registry=reg,
        )
        self._outcomes = Counter(
            "slotd_task_outcomes",
            "Attempts by how they ended",
            ["task_type", "outcome"],
            registry=reg,
        )
        self._duration = Histogram(
            "slotd_task_duration_seconds",
            "Handler run time",
            ["task_type"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self._start_delay = Histogram(
            "slotd_task_start_delay_seconds",
            "From the moment a task was due to the moment its handler started",
            ["task_type"],
            buckets=START_DELAY_BUCKETS,
            registry=reg,
        )
        self._empty_claims = Counter(
            "slotd_claims_empty",
            "Claims that found nothing to take (another slot or replica was faster)",
            registry=reg,
        )
        self._read_lane_misses = Counter(
            "slotd_read_lane_misses",
            "Read-lane discoveries whose every candidate was gone on the primary (replica "
            "lag, or faster slots); each is followed by one discovery on the primary",
            registry=reg,
        )
        self._restarts = Counter(
            "slotd_slot_restarts", "Slot or runner process restarts", ["reason"], registry=reg
        )
        self._faults = Counter(
            "slotd_faults_injected", "Faults injected (staging chaos)", ["kind"], registry=reg
        )
        self._limit = Gauge(
            "slotd_task_type_limit",
            "max_running of a limited task type on this replica (fleet-wide limit)",
            ["task_type"],
            registry=reg,
        )
        self._group_limit = Gauge(
            "slotd_task_group_limit",
            "max_running_per_group of a task type limited per group",
            ["task_type"],
            registry=reg,
        )
        # Read by this replica's heartbeat on the primary (slotd.horizon): 0 until then.
        self._horizon_age = Gauge(
            "slotd_vacuum_horizon_age_seconds",
            "How long the transaction holding back the database's xmin horizon the longest "
            "has been open (0: none, or a holder with no start time: see _xids)",
            registry=reg,
        )
        self._horizon_xids = Gauge(
            "slotd_vacuum_horizon_xids",
            "How many transactions the database's xmin horizon is behind",
            registry=reg,
        )
        for task_type, (most, per_group) in (limits or {}).items():
            if most is not None:
                self._limit.labels(task_type).set(most)
            if per_group is not None:
                self._group_limit.labels(task_type).set(per_group)
        for task_type in self.task_types:
            self._handlers.labels(task_type).set(1)
            self._duration.labels(task_type)
            self._start_delay.labels(task_type)
            for outcome in OUTCOMES:
                self._outcomes.labels(task_type, outcome)
        for reason in RESTART_REASONS:
            self._restarts.labels(reason)
        for kind in FAULT_KINDS:
            self._faults.labels(kind)

        self._fleet: _FleetCollector | None = None
        if gauge_source is not None:
            self._fleet = _FleetCollector(gauge_source, ttl, max_stale, self.task_types, clock)
            reg.register(self._fleet)

    def set_slots(self, slots: int) -> None:
        self._slots.set(slots)

    def set_horizon(self, holder: Holder | None) -> None:
        """None when nothing holds the horizon."""
        self._horizon_age.set(0.0 if holder is None else holder.age_s or 0.0)
        self._horizon_xids.set(0.0 if holder is None else float(holder.xids))

    def record_outcome(
        self,
        task_type: str,
        outcome: str,
        duration: float | None,
        start_delay: float | None,
    ) -> None:
        if outcome not in OUTCOMES:
            # A bad message from a slot must not take the supervisor down; it is a bug to
            # report, and an unbounded label value would be worse than a missing count.
            log.error("dropped a task outcome with unknown outcome %r (%s)", outcome, task_type)
            return
        self._outcomes.labels(task_type, outcome).inc()
        if duration is not None:
            self._duration.labels(task_type).observe(max(duration, 0.0))
        if start_delay is not None:
            # Clocks of two hosts can disagree by milliseconds; a negative delay is zero.
            self._start_delay.labels(task_type).observe(max(start_delay, 0.0))

    def record_empty_claim(self) -> None:
        self._empty_claims.inc()

    def record_read_lane_miss(self) -> None:
        self._read_lane_misses.inc()

    def record_restart(self, reason: str) -> None:
        self._restarts.labels(reason).inc()

    def record_fault(self, kind: str) -> None:
        self._faults.labels(kind).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
