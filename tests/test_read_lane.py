"""Discovery on a real streaming replica that lags: a read lane offering rows the primary
already finished costs one discovery on the primary, not a poll interval."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import psycopg
import pytest

import slotd
from slotd.dev.localpg import LocalPostgres, scratch
from slotd.repository import migrate
from tests.daemon import Daemon, wait_for
from tests.replica import streaming_replica


@pytest.fixture
def lagging(daemons: list[Daemon]) -> Iterator[tuple[LocalPostgres, LocalPostgres]]:
    with scratch(prefix="slotd-lag-", port=5434) as primary:
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            migrate(conn)
        with streaming_replica(primary, apply_delay="3s") as replica:
            yield primary, replica


def count(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0])  # type: ignore[index]


def test_a_lagging_read_lane_falls_back_to_one_discovery_on_the_primary(
    lagging: tuple[LocalPostgres, LocalPostgres], daemons: list[Daemon]
) -> None:
    primary, replica = lagging
    with psycopg.connect(primary.url()) as conn:
        slotd.enqueue_many(conn, [("rt.quick", {}) for _ in range(100)])
    wait_for(lambda: count(replica.url()) == 100, timeout=30, what="the rows on the replica")
    # One slot reads 20 candidates at a time; with a 10-minute tick, a stale read lane
    # (the first 20 are finished on the primary, still listed on the replica for 3 s)
    # would leave the other 80 waiting for the tick.
    daemon = Daemon(
        primary.url(),
        slots=1,
        env={
            "SLOTD_DATABASE_URL_READ": replica.url(),
            "SLOTD_POLL_INTERVAL": "10m",
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        },
    )
    daemons.append(daemon)
    daemon.start()
    metrics = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()
    wait_for(lambda: count(primary.url()) == 0, timeout=90, what="the burst drained")
    body = urllib.request.urlopen(metrics, timeout=5).read().decode()
    misses = [ln for ln in body.splitlines() if ln.startswith("slotd_read_lane_misses_total")]
    assert misses and float(misses[0].split()[-1]) >= 1
