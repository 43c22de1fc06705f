"""`slotd migrate` under a live fleet: each step's wait for a table lock is bounded, and a
try that hits the bound is rolled back whole and tried again after a pause, until it lands
or the operator's patience runs out (then one line naming who holds the tables, and nothing
applied). Without the bound, an ALTER queued behind one long transaction would hold every
enqueue and claim behind it for as long as that transaction lasts (sql/queries.sql,
migrate_lock_timeout_set)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from slotd.config import format_duration
from slotd.errors import MigrationBlocked, MigrationLockTimeout
from slotd.repository import migrate, migrate_lock_holders

LOCK_TIMEOUT = timedelta(milliseconds=500)  # under deadlock_timeout (1 s): no deadlock check
PATIENCE = timedelta(minutes=5)
FIRST_PAUSE_S, LAST_PAUSE_S = 0.5, 10.0


def holders_text(holders: list[dict[str, Any]]) -> str:
    if not holders:
        return "no holder left by the time it was asked"
    return "; ".join(
        f"pid {h['pid']} ({h['who']}, {h['state']}, transaction open {format_duration(h['age_s'])},"
        f" on {h['tables']})"
        for h in holders
    )


def migrate_live(
    conn: psycopg.Connection[Any],
    *,
    force: bool = False,
    schema: str | None = None,
    lock_timeout: timedelta = LOCK_TIMEOUT,
    patience: timedelta = PATIENCE,
    say: Callable[[str], None] = lambda _line: None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """migrate() with each lock wait bounded by `lock_timeout`, retried with growing,
    jittered pauses (0.5 s doubling to 10 s: a fleet's own short transactions end within
    the first, a report's may take a while) until `patience` has passed since the first
    try; each failed try is one `say` line. MigrationBlocked when patience runs out."""
    started = clock()
    pause, tries = FIRST_PAUSE_S, 0
    while True:
        tries += 1
        try:
            return migrate(conn, force=force, schema=schema, lock_timeout=lock_timeout)
        except MigrationLockTimeout as exc:
            holders = holders_text(migrate_lock_holders(conn, schema=schema))
            waited = clock() - started
            bound = format_duration(lock_timeout)
            if waited + pause > patience.total_seconds():
                raise MigrationBlocked(
                    f"gave up after {format_duration(waited)} and {tries} tries: {exc.step}"
                    f" could not take its table lock within {bound}; nothing applied;"
                    f" holding slotd's tables: {holders}"
                ) from exc
            say(
                f"slotd migrate: {exc.step} could not take its table lock within {bound}"
                f" (try {tries}; nothing applied); holding slotd's tables: {holders};"
                f" trying again in {pause:.1f}s"
            )
            sleep(pause)
            pause = min(LAST_PAUSE_S, pause * 2) * random.uniform(0.8, 1.2)
