"""Who holds back vacuum: each replica reads it every heartbeat and names it (a warning, a
gauge, `slotd status`). Real sessions held open on a real server, a real `slotd run`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.repository import Repository
from slotd.supervisor.horizon import UNTIMED_SHOWN_XIDS, Holder, HorizonWatch, status_line
from tests.daemon import ROOT, Daemon, wait_for


@pytest.fixture
def report(db_url: str, conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A report's REPEATABLE READ transaction left open after its first read, with work
    committed since (so the horizon is behind it)."""
    with psycopg.connect(db_url, application_name="nightly-report") as held:
        held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        held.execute("SELECT count(*) FROM slotd_tasks").fetchone()
        slotd.enqueue_many(conn, [("t", {})] * 3)
        yield held


def test_the_holder_is_the_oldest_open_transaction_by_name(
    report: psycopg.Connection[Any], conn: psycopg.Connection[Any]
) -> None:
    holder = Holder.from_row(Repository(conn).horizon_holder())
    assert holder is not None
    assert (holder.kind, holder.pid, holder.who) == ("session", report.info.backend_pid,
                                                      "nightly-report")  # fmt: skip
    assert holder.state == "idle in transaction" and holder.xids >= 1
    assert holder.age_s is not None and holder.age_s >= 0
    report.rollback()
    after = Holder.from_row(Repository(conn).horizon_holder())
    assert after is None or after.pid != report.info.backend_pid


def test_an_idle_writer_holds_it_by_its_own_transaction_id(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """READ COMMITTED keeps no snapshot between statements, but a transaction that wrote and
    sits idle holds the horizon by its xid all the same."""
    with psycopg.connect(db_url, application_name="forgotten-psql") as writer:
        slotd.enqueue(writer, "t")  # uncommitted
        slotd.enqueue_many(conn, [("t", {})] * 3)
        holder = Holder.from_row(Repository(conn).horizon_holder())
        assert holder is not None and holder.who == "forgotten-psql" and holder.xids >= 1
        writer.rollback()


def test_slotd_status_names_the_holder_once_it_is_old_enough(
    report: psycopg.Connection[Any], db_url: str
) -> None:
    def status(warn: str, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "slotd", "status", *args],
            env={
                **os.environ,
                "SLOTD_DATABASE_URL": db_url,
                "SLOTD_HORIZON_WARN": warn,
                "PYTHONPATH": str(ROOT),
            },  # fmt: skip
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    pid = report.info.backend_pid
    line = next(x for x in status("1ms").splitlines() if x.startswith("vacuum horizon:"))
    assert line.startswith(f"vacuum horizon: held back by pid {pid} (nightly-report), idle in")
    assert "transactions behind" in line
    assert "vacuum horizon: not held back" in status("1h")  # younger than the warning
    report_json = json.loads(status("1h", "--json"))["vacuum_horizon"]
    assert report_json["pid"] == pid and report_json["who"] == "nightly-report"


def test_a_replica_warns_names_and_gauges_the_holder_then_says_it_ended(
    report: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    env = {"SLOTD_HORIZON_WARN": "1ms", "SLOTD_HEARTBEAT_INTERVAL": "1s",
           "SLOTD_METRICS_ADDR": "127.0.0.1:0"}  # fmt: skip
    daemon = Daemon(db_url, env=env)
    daemons.append(daemon.start())
    pid = report.info.backend_pid
    warned = daemon.wait_line(rf"vacuum is held back by pid {pid} \(nightly-report\)")
    assert "idle in transaction" in warned and "WARNING" in warned
    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()

    def gauge(name: str) -> float:
        with urllib.request.urlopen(url, timeout=10) as page:
            text = page.read().decode()
        return next(float(x.split()[1]) for x in text.splitlines() if x.startswith(name + " "))

    first = gauge("slotd_vacuum_horizon_age_seconds")
    assert first > 0 and gauge("slotd_vacuum_horizon_xids") >= 1
    # Two heartbeats' readings later (1 s apart here; the gauge is each reading's age) ...
    wait_for(lambda: gauge("slotd_vacuum_horizon_age_seconds") >= first + 2, what="readings")
    # ... still one warning: one per holder, not one per heartbeat.
    assert len([x for x in daemon.lines if "vacuum is held back" in x]) == 1
    report.rollback()
    daemon.wait_line(r"the vacuum horizon is no longer held back")
    wait_for(lambda: gauge("slotd_vacuum_horizon_age_seconds") == 0, what="the gauge to drop")


def test_the_watch_warns_once_repeats_after_ten_minutes_and_reads_untimed_holders(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    watch = HorizonWatch(timedelta(minutes=5), clock=lambda: now[0])
    young = Holder("session", 7, "report", "idle in transaction", 60.0, 500)
    old = Holder("session", 7, "report", "idle in transaction", 400.0, 900)
    with caplog.at_level(logging.INFO, logger="slotd.supervisor"):
        assert watch.seen(young) is None
        first = watch.seen(old)
        assert first is not None and first.startswith("vacuum is held back by pid 7 (report)")
        now[0] = 599.0
        assert watch.seen(old) is None
        now[0] = 601.0
        assert watch.seen(old) == first  # the same holder, ten minutes on
        assert watch.seen(None) == "the vacuum horizon is no longer held back"
        assert watch.seen(None) is None
    levels = [r.levelname for r in caplog.records]
    assert levels == ["WARNING", "WARNING", "INFO"]
    slot = Holder("replication slot", None, "standby_a", "inactive", None, UNTIMED_SHOWN_XIDS)
    assert watch.seen(slot) is not None
    assert status_line(slot, timedelta(minutes=5)) == (
        "vacuum horizon: held back by replication slot standby_a, inactive, 10,000 "
        "transactions behind"
    )
    shy = Holder("replication slot", None, "standby_a", "active", None, UNTIMED_SHOWN_XIDS - 1)
    assert status_line(shy, timedelta(minutes=5)) == "vacuum horizon: not held back"
    assert status_line(old, timedelta(0)) == "vacuum horizon: not held back"  # 0: never
