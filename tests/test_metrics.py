"""Metrics: each fleet gauge against a crafted table, the counters, caching, the endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import psycopg
import pytest

from slotd.errors import ConfigError
from slotd.ops.metrics import Metrics, db_gauge_source
from slotd.ops.metrics_server import parse_addr, serve

TYPES = ["alpha", "beta"]


def add(conn: psycopg.Connection[Any], task_type: str, **cols: str) -> int:
    """One row with columns given as SQL expressions (so now() is the database's)."""
    names = ["task_type", *cols]
    values = ["%s", *cols.values()]
    sql = f"INSERT INTO slotd_tasks ({', '.join(names)}) VALUES ({', '.join(values)}) RETURNING id"
    return conn.execute(sql, (task_type,)).fetchone()[0]  # type: ignore[arg-type,index]


LIVE_LEASE = {
    "lease_token": "gen_random_uuid()",
    "lease_expires_at": "now() + interval '5 minutes'",
    "last_attempted_at": "now()",
}
EXPIRED_LEASE = {
    "lease_token": "gen_random_uuid()",
    "lease_expires_at": "now() - interval '1 second'",
    "last_attempted_at": "now() - interval '6 minutes'",
}


@pytest.fixture
def table(conn: psycopg.Connection[Any]) -> None:
    # alpha: two due, one far in the future, one running (attempt 1 under a live lease)
    add(conn, "alpha", run_at="now() - interval '100 seconds'")
    add(conn, "alpha", run_at="now() - interval '10 seconds'")
    add(conn, "alpha", run_at="now() + interval '1 hour'")
    add(conn, "alpha", run_at="now() - interval '1 hour'", attempt_count="1", **LIVE_LEASE)
    # beta: two dead letters (one with an expired lease: abandoned on its last attempt),
    # one on its final attempt under a live lease (pending and running, not dead), and one
    # whose lease expired mid-retry (claimable again: pending, due, not running)
    add(conn, "beta", attempt_count="20", last_attempted_at="now() - interval '1 day'")
    add(conn, "beta", run_at="now() - interval '2 hours'", attempt_count="20", **EXPIRED_LEASE)
    add(conn, "beta", run_at="now() - interval '3 hours'", attempt_count="20", **LIVE_LEASE)
    add(conn, "beta", run_at="now() - interval '50 seconds'", attempt_count="3", **EXPIRED_LEASE)
    # gamma: served by no replica here, only dead letters
    add(conn, "gamma", attempt_count="5", max_attempts="5")


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_fleet_gauges_match_the_table(db_url: str, table: None) -> None:
    source = db_gauge_source(db_url)
    try:
        metrics = Metrics(slots=3, task_types=TYPES, gauge_source=source)
        assert value(metrics, "slotd_tasks_pending", task_type="alpha") == 4
        assert value(metrics, "slotd_tasks_pending", task_type="beta") == 2
        assert value(metrics, "slotd_tasks_pending", task_type="gamma") is None
        assert value(metrics, "slotd_tasks_running", task_type="alpha") == 1
        assert value(metrics, "slotd_tasks_running", task_type="beta") == 1
        assert value(metrics, "slotd_tasks_running", task_type="gamma") is None
        assert value(metrics, "slotd_tasks_dead", task_type="alpha") == 0  # own type: zero
        assert value(metrics, "slotd_tasks_dead", task_type="beta") == 2
        assert value(metrics, "slotd_tasks_dead", task_type="gamma") == 1
        # The running rows were due an hour ago but are leased, so they do not count.
        oldest = value(metrics, "slotd_task_oldest_due_seconds")
        assert oldest is not None and 100 <= oldest < 160
        assert value(metrics, "slotd_task_slots") == 3
        assert value(metrics, "slotd_gauges_up") == 1
        assert (value(metrics, "slotd_gauges_last_success_timestamp_seconds") or 0) > 0
    finally:
        source.close()


def test_running_is_absent_when_nothing_runs_and_gone_types_vanish(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    add(conn, "alpha", run_at="now() - interval '5 seconds'")
    add(conn, "retired", attempt_count="20")
    source = db_gauge_source(db_url)
    try:
        metrics = Metrics(slots=1, task_types=["alpha"], gauge_source=source, ttl=0)
        text = metrics.render().decode()
        assert "slotd_tasks_running{" not in text  # the alert's `or vector(0)` relies on it
        assert 'slotd_tasks_dead{task_type="retired"} 1.0' in text
        conn.execute("DELETE FROM slotd_tasks WHERE task_type = 'retired'")
        text = metrics.render().decode()
        assert "retired" not in text
        assert 'slotd_tasks_pending{task_type="alpha"} 1.0' in text
    finally:
        source.close()


def test_empty_table_reads_zero_oldest_due(db_url: str) -> None:
    source = db_gauge_source(db_url)
    try:
        metrics = Metrics(slots=1, task_types=["alpha"], gauge_source=source)
        assert value(metrics, "slotd_task_oldest_due_seconds") == 0
        assert value(metrics, "slotd_tasks_pending", task_type="alpha") == 0
    finally:
        source.close()


class Counting:
    def __init__(self, result: dict[str, Any] | None = None) -> None:
        self.calls = 0
        self.fail = False
        self.result = result or {
            "pending": {"alpha": 2},
            "running": {},
            "dead": {},
            "oldest_due_seconds": 7.5,
        }

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.fail:
            raise psycopg.OperationalError("connection to postgresql://u:hunter2@db/x failed")
        return self.result


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_scrapes_within_ttl_share_one_query() -> None:
    source, clock = Counting(), Clock()
    metrics = Metrics(1, ["alpha"], source, ttl=5.0, clock=clock)
    metrics.render()
    clock.now += 4.9
    metrics.render()
    assert source.calls == 1
    clock.now += 0.2
    metrics.render()
    assert source.calls == 2


def test_failed_refresh_keeps_last_values_for_a_while_then_drops_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock = Counting(), Clock()
    metrics = Metrics(1, ["alpha"], source, ttl=5.0, max_stale=30.0, clock=clock)
    assert value(metrics, "slotd_tasks_pending", task_type="alpha") == 2
    first_success = value(metrics, "slotd_gauges_last_success_timestamp_seconds")

    source.fail = True
    clock.now += 10
    assert value(metrics, "slotd_gauges_up") == 0
    assert value(metrics, "slotd_tasks_pending", task_type="alpha") == 2  # stale but kept
    assert value(metrics, "slotd_gauges_last_success_timestamp_seconds") == first_success
    assert value(metrics, "slotd_gauges_refresh_errors_total") == 1
    calls = source.calls
    metrics.render()  # a failure is cached too: a down primary is not hammered
    assert source.calls == calls

    clock.now += 30
    assert value(metrics, "slotd_tasks_pending", task_type="alpha") is None
    assert value(metrics, "slotd_task_oldest_due_seconds") is None
    assert "hunter2" not in caplog.text

    source.fail = False
    clock.now += 10
    assert value(metrics, "slotd_gauges_up") == 1
    assert value(metrics, "slotd_tasks_pending", task_type="alpha") == 2


def test_gauge_source_reconnects_after_the_connection_breaks(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    source = db_gauge_source(db_url)
    try:
        assert source()["pending"] == {}
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'slotd metrics'"
        )
        with pytest.raises(psycopg.Error):
            source()
        add(conn, "alpha")
        assert source()["pending"] == {"alpha": 1}
    finally:
        source.close()


def test_counters_and_histograms() -> None:
    metrics = Metrics(slots=2, task_types=TYPES, gauge_source=None)
    # Pre-initialised: every outcome of every own type reads zero before anything happens.
    for task_type in TYPES:
        assert value(metrics, "slotd_replica_handlers", task_type=task_type) == 1
        for outcome in ("success", "failure", "timeout", "continued", "cancelled", "lost"):
            labels = {"task_type": task_type, "outcome": outcome}
            assert value(metrics, "slotd_task_outcomes_total", **labels) == 0
        assert value(metrics, "slotd_task_duration_seconds_count", task_type=task_type) == 0
    assert value(metrics, "slotd_slot_restarts_total", reason="runner_crashed") == 0
    assert value(metrics, "slotd_claims_empty_total") == 0

    metrics.record_outcome("alpha", "success", 0.004, 1.5)
    metrics.record_outcome("alpha", "success", 0.2, None)
    metrics.record_outcome("alpha", "crashed", None, 0.1)
    metrics.record_outcome("beta", "timeout", 4000.0, -0.01)
    metrics.record_outcome("alpha", "exploded", 1.0, 1.0)  # dropped, not a new label
    metrics.record_empty_claim()
    metrics.record_empty_claim()
    metrics.record_restart("slot_died")
    metrics.record_fault("crash")

    assert value(metrics, "slotd_task_outcomes_total", task_type="alpha", outcome="success") == 2
    assert value(metrics, "slotd_task_outcomes_total", task_type="alpha", outcome="crashed") == 1
    assert value(metrics, "slotd_task_outcomes_total", task_type="beta", outcome="timeout") == 1
    assert (
        value(metrics, "slotd_task_outcomes_total", task_type="alpha", outcome="exploded") is None
    )
    assert value(metrics, "slotd_task_duration_seconds_count", task_type="alpha") == 2
    assert value(metrics, "slotd_task_duration_seconds_sum", task_type="alpha") == pytest.approx(
        0.204
    )
    assert value(metrics, "slotd_task_duration_seconds_bucket", task_type="alpha", le="0.005") == 1
    assert value(metrics, "slotd_task_duration_seconds_bucket", task_type="beta", le="3600.0") == 0
    assert value(metrics, "slotd_task_duration_seconds_bucket", task_type="beta", le="+Inf") == 1
    assert value(metrics, "slotd_task_start_delay_seconds_count", task_type="alpha") == 2
    assert value(metrics, "slotd_task_start_delay_seconds_sum", task_type="beta") == 0
    assert value(metrics, "slotd_claims_empty_total") == 2
    assert value(metrics, "slotd_slot_restarts_total", reason="slot_died") == 1
    assert value(metrics, "slotd_faults_injected_total", kind="crash") == 1
    text = metrics.render().decode()
    assert "slotd_tasks_pending" not in text  # no gauge source, no fleet gauges


def test_own_registry_not_the_global_one() -> None:
    from prometheus_client import REGISTRY

    a = Metrics(1, ["alpha"], None)
    b = Metrics(1, ["alpha"], None)  # a second instance must not collide
    a.record_empty_claim()
    assert b.registry.get_sample_value("slotd_claims_empty_total") == 0
    assert REGISTRY.get_sample_value("slotd_claims_empty_total") is None


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_endpoints_over_http() -> None:
    metrics = Metrics(4, ["alpha"], Counting())
    state = {"healthy": True, "ready": False}

    def health() -> tuple[bool, str]:
        return state["healthy"], "4/4 slots up" if state["healthy"] else "slot 2 is down"

    def ready() -> tuple[bool, str]:
        if state["ready"] is None:
            raise RuntimeError("cannot reach postgresql://u:hunter2@db/x")
        return bool(state["ready"]), "listening" if state["ready"] else "not connected"

    server = serve("127.0.0.1:0", metrics, health, ready)
    try:
        assert server.port > 0
        status, ctype, body = get(f"{server.url}/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        assert "slotd_task_slots 4.0" in body
        assert 'slotd_tasks_pending{task_type="alpha"} 2.0' in body
        assert "slotd_task_oldest_due_seconds 7.5" in body

        assert get(f"{server.url}/healthz")[::2] == (200, "4/4 slots up\n")
        assert get(f"{server.url}/readyz")[::2] == (503, "not connected\n")
        state.update(healthy=False, ready=True)
        assert get(f"{server.url}/healthz")[::2] == (503, "slot 2 is down\n")
        assert get(f"{server.url}/readyz")[::2] == (200, "listening\n")
        state["ready"] = None  # type: ignore[assignment]
        status, _, body = get(f"{server.url}/readyz")
        assert status == 503 and "hunter2" not in body and "check failed" in body
        assert get(f"{server.url}/nope")[0] == 404
    finally:
        server.close()


def test_parse_addr() -> None:
    assert parse_addr("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_addr("[::1]:0") == ("::1", 0)
    assert parse_addr(":9464") == ("", 9464)
    for bad in ("localhost", "host:port", "1.2.3.4:70000"):
        with pytest.raises(ConfigError):
            parse_addr(bad)
