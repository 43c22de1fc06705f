"""Fleet chores the supervisor runs: the hourly retention of dead letters, of stored
results past their keep_result, and of workflow bookkeeping (edges, completed batches)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from slotd.config import format_duration
from slotd.repository import Repository

RETENTION_CHORE = "retention"
RETENTION_PERIOD = timedelta(hours=1)
PRUNE_BATCH = 5000


def prune(
    repo: Repository, retention: timedelta, batch: int = PRUNE_BATCH
) -> tuple[int, BaseException | None]:
    """Delete dead letters older than `retention`, one committed transaction per batch.
    Returns how many went and the error that stopped it, if any: batches committed before
    an error stay committed, so the count is what the caller must report either way."""
    total = 0
    try:
        while True:
            pruned = repo.dead_purge_batch(older_than=retention, batch=batch)
            total += pruned
            if pruned < batch:
                break
        # Results carry their own expiry (keep_result), not the dead letters' retention.
        while True:
            pruned = repo.prune_results_batch(batch=batch)
            total += pruned
            if pruned < batch:
                break
        # Attempts of tasks no longer answerable (not counted: a task's, gone with it).
        while repo.prune_attempts_batch(batch=batch) >= batch:
            pass
        # Rate windows with no start left in them (not counted: they are not tasks).
        while repo.prune_rate_windows_batch(batch=batch) >= batch:
            pass
        # Edges whose dependant is gone, and batches completed before the retention (not
        # counted: they are bookkeeping, not tasks).
        while repo.prune_dependencies_batch(batch=batch) >= batch:
            pass
        while repo.prune_batches(retention.total_seconds(), batch=batch) >= batch:
            pass
        # Emits kept for waits that begin late (ctx.wait_event), for the same retention.
        while repo.prune_events_batch(retention.total_seconds(), batch=batch) >= batch:
            pass
        # Fair types' turns of groups that started nothing since (sql/081).
        while repo.prune_turns_batch(retention.total_seconds(), batch=batch) >= batch:
            pass
        return total, None
    except Exception as exc:
        return total, exc


def hourly_cleanup(
    repo: Repository,
    retention: timedelta,
    log: logging.Logger | logging.LoggerAdapter[Any],
    *,
    batch: int = PRUNE_BATCH,
) -> int | None:
    """Prune dead letters past retention if this replica wins this hour's election.

    Returns the number pruned, or None when another replica has the chore this hour. The
    election is a row (slotd_maintenance), so it needs no session held open; an error
    after winning is logged with what was pruned and re-raised, and the next hour's
    winner picks up the rest."""
    if not repo.elect_chore(RETENTION_CHORE, RETENTION_PERIOD):
        return None
    started = time.monotonic()
    pruned, error = prune(repo, retention, batch)
    fields = {
        "chore": RETENTION_CHORE,
        "pruned": pruned,
        "retention": format_duration(retention),
        "duration": round(time.monotonic() - started, 3),
    }
    if error is not None:
        log.error(
            "retention stopped after pruning %d dead letters: %s", pruned, error, extra=fields
        )
        raise error
    if pruned:
        log.info(
            "retention pruned %d dead letters older than %s",
            pruned,
            format_duration(retention),
            extra=fields,
        )
    else:
        log.info(
            "retention: no dead letters older than %s", format_duration(retention), extra=fields
        )
    return pruned
