"""What each page shows, read through the repository's dashboard statements. Plain data
in, plain data out: the templates only lay it out."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from slotd.ops import history
from slotd.repository import DashboardReads
from slotd.repository import history as record
from slotd.web import charts, listings
from slotd.web.formats import duration, relative, stamp


def overview(reads: DashboardReads, window: charts.Window = charts.HOUR) -> dict[str, Any]:
    attempts = reads.outcomes(window.unit, window.buckets)
    throughput = charts.per_type(attempts, window)
    # A type whose tasks all succeeded has no row left, but it worked in this window.
    types = sorted(set(reads.types()) | set(throughput))
    counts = reads.counts(types)
    replicas = reads.replicas()
    served = {t for r in replicas for t in r["task_types"]}
    paused = _paused_types(reads)
    limits = _limits(replicas)
    tables = reads.tables()
    rates = _rates(reads) if "slotd_rate_windows" in tables else {}
    # Halted sequences wait for an operator (#39): shown here as `slotd status` shows them,
    # resumable from the page.
    halted = reads.halted_sequences(HALTED_SHOWN) if "slotd_sequences" in tables else []
    slots = sum(r["slots"] for r in replicas)
    busy = sum(len(r["leases"] or {}) for r in replicas)
    rows = []
    for row in counts:
        has_work = row["pending"] or row["running"]
        waiting = row["oldest_due_s"]
        rows.append(
            {
                **row,
                "capped": {k: row[k] >= reads.COUNT_CAP for k in ("pending", "running", "dead")},
                "unserved": bool(has_work) and row["task_type"] not in served,
                "paused": paused.get(row["task_type"]),
                "limit": limits.get(row["task_type"]),
                "rate": rates.get(row["task_type"]),
                "throughput": throughput.get(row["task_type"]),
                "starved": waiting is not None and waiting >= STARVED_S,
            }
        )
    # Paused types wait on purpose: left out, as the oldest-due gauge leaves them out.
    live = [r for r in rows if r["oldest_due_s"] is not None and not r["paused"]]
    oldest = max(live, key=lambda r: r["oldest_due_s"], default=None)
    return {
        "types": rows,
        "oldest": oldest,
        "starved_s": STARVED_S,
        "all_busy": bool(slots) and busy >= slots,
        "cap": reads.COUNT_CAP,
        "replicas": replicas,
        "slots": slots,
        "busy": busy,
        "chart": charts.outcomes(attempts, window),
        "backlog": charts.backlog(history_rows(reads, tables, window), window),
        "window": window,
        "alarm": _alarm(history.recent_outcomes(reads.conn)),
        "halted": halted,
        "halted_shown": HALTED_SHOWN,
        "paused_known": bool(paused),
        "limits_known": bool(limits),
        "rates_known": bool(rates),
    }


# How many halted sequences the overview lists (`slotd sequences --halted` lists them all).
HALTED_SHOWN = 10

# Due work that has waited this long is flagged (the starvation alert waits 300 s; an
# operator looking at the page wants to see a type fall behind well before that).
STARVED_S = 30.0


def history_rows(
    reads: DashboardReads, tables: set[str], window: charts.Window, task_type: str | None = None
) -> list[dict[str, Any]]:
    """The backlog samples, once the database has their table (migration 012)."""
    if "slotd_queue_history" not in tables:
        return []
    return record.queue_history(reads.conn, window.unit, window.buckets, task_type)


def _alarm(recent: history.RecentOutcomes) -> list[dict[str, Any]]:
    """lost / crashed attempts of the last minutes, each with what it means."""
    return [
        {"outcome": o, "count": n, "reason": history.ALARM_REASONS[o], "minutes": recent.minutes}
        for o, n in recent.alarming.items()
    ]


def _paused_types(reads: DashboardReads) -> dict[str, str]:
    """The types `slotd pause` holds now (the same statement as `slotd status`)."""
    out = {}
    for row in reads.paused():
        until = row["until"]
        out[row["task_type"]] = (
            "until " + until.strftime("%Y-%m-%d %H:%M UTC") if until else "paused"
        )
    return out


def _limits(replicas: list[dict[str, Any]]) -> dict[str, str]:
    """Concurrency limits as replicas declare them (slotd_replicas.limits, where present:
    {"type": [max_running, max_running_per_group]})."""
    out: dict[str, str] = {}
    for replica in replicas:
        for task_type, pair in (replica.get("limits") or {}).items():
            total, per_group = (list(pair) + [None, None])[:2]
            parts = [
                f"{total} running" if total else "",
                f"{per_group} per group" if per_group else "",
            ]
            out.setdefault(task_type, ", ".join(p for p in parts if p))
    return out


def _tenths(seconds: float) -> str:
    # A 2 s window's next start is 0.4 s away, not "0s".
    return f"{round(seconds, 1):g}s" if seconds < 60 else duration(seconds)


def _rates(reads: DashboardReads) -> dict[str, str]:
    """Each rated type's current window: "2/4 per 2s, next start in 0.4s; 3 groups full"."""
    out: dict[str, str] = {}
    for task_type, r in reads.rates().items():
        parts = []
        if "allowed" in r:
            free = "now" if r["free_s"] <= 0 else f"in {_tenths(r['free_s'])}"
            window = f"{int(r['used'])}/{int(r['allowed'])} per {_tenths(r['window_s'])}"
            parts.append(f"{window}, next start {free}")
        if r.get("groups_full"):
            parts.append(f"{int(r['groups_full'])} groups full")
        out[task_type] = "; ".join(parts)
    return out


TYPE_ROWS = 20


def task_type(
    reads: DashboardReads, name: str, window: charts.Window = charts.HOUR
) -> dict[str, Any]:
    """A type's page: its counts and flags as the overview has them, its attempts and
    backlog charted, its first live tasks in due order and its newest dead letters."""
    tables = reads.tables()
    counts = reads.counts([name])[0]
    replicas = reads.replicas()
    attempts = reads.outcomes(window.unit, window.buckets, name)
    search = {"task_type": name, "key_types": []}
    live = reads.tasks_page(search, None, TYPE_ROWS)
    listings.mark_states(live)
    dead = [r for r in reads.dead_page(search, None, TYPE_ROWS) if not r.get("window_end")]
    listings.shorten(dead)
    waiting = counts["oldest_due_s"]
    return {
        "task_type": name,
        "counts": counts,
        "cap": reads.COUNT_CAP,
        "capped": {k: counts[k] >= reads.COUNT_CAP for k in ("pending", "running", "dead")},
        "served_by": [r for r in replicas if name in r["task_types"]],
        "paused": _paused_types(reads).get(name),
        "limit": _limits(replicas).get(name),
        "rate": _rates(reads).get(name) if "slotd_rate_windows" in tables else None,
        "starved": waiting is not None and waiting >= STARVED_S,
        "chart": charts.outcomes(attempts, window),
        "throughput": charts.per_type(attempts, window).get(name),
        "backlog": charts.backlog(history_rows(reads, tables, window, name), window),
        "window": window,
        "live": live,
        "dead_rows": dead,
        "shown": TYPE_ROWS,
    }


def running(reads: DashboardReads, lease_margin: timedelta) -> list[dict[str, Any]]:
    rows = reads.running(lease_margin)
    for row in rows:
        now = row["db_now"]
        row["remaining_s"] = (row["deadline"] - now).total_seconds()
        row["overdue"] = row["remaining_s"] < 0
        row["deadline_ms"] = int(row["deadline"].timestamp() * 1000)
        row["now_ms"] = int(now.timestamp() * 1000)
        started = row["started_at"]
        row["age_s"] = (now - started).total_seconds() if started else None
    return rows


# How many parents and dependants a task's page draws, each side.
NEIGHBOURS = 30
BATCH_MEMBERS = 24
# A task's attempts and steps, a page at a time (a task retried, snoozed or stepping 10,000
# times must not make its page 10,000 rows), and each attempt's error cut at this length.
ATTEMPTS = 20
STEPS = 50
ERROR_CHARS = 20_000


def task(
    reads: DashboardReads, task_id: int, attempts_before: int | None = None, steps_from: int = 0
) -> dict[str, Any] | None:
    """A task's page: its life while it has a row (state, times, what it waits for), else
    what its kept success left (keep_result, keep_history); its attempts and steps a page
    at a time; its result, parents, dependants (each with its state) and batch either way."""
    row = reads.task(task_id)
    result = reads.result(task_id)
    if row is None:
        kept = reads.kept(task_id)
        if result is None or kept is None:
            return None
        row = {**kept, "finished": True, "state": result[0], "dead": False, "step_count": 0}
        row["ended_at"], row["started_at"] = kept["succeeded_at"], kept["first_started_at"]
    else:
        row["finished"] = False
        _live_task(row)
    state, value, error = result or (row["state"], None, None)
    row["result_state"] = state
    # The graph's box: the task's state in slotd's one vocabulary (#37, fragment task_state).
    row["graph_state"] = state
    row["result_text"] = None if value is None else json.dumps(value, indent=2, sort_keys=True)
    row["result_error"] = error
    row["waits_for"] = _waits_for(row)
    _attempts(reads, row, attempts_before)
    row["steps"] = reads.steps(task_id, steps_from, STEPS) if row["step_count"] else []
    row["steps_from"] = steps_from
    row["steps_next"] = steps_from + STEPS if steps_from + STEPS < row["step_count"] else None
    row["steps_shown"] = STEPS
    neighbours = reads.neighbours(task_id, NEIGHBOURS)
    for n in neighbours:
        n["means"] = _parent_means(n["state"]) if n["side"] == "parent" else n["state"]
    row["neighbours"] = neighbours
    row["parents"] = [n for n in neighbours if n["side"] == "parent"]
    row["dependants"] = [n for n in neighbours if n["side"] == "dependant"]
    row["neighbour_cap"] = NEIGHBOURS
    batch_id = row.get("batch_id")
    row["batch"] = reads.batch(batch_id) if batch_id is not None else None
    return row


def _attempts(reads: DashboardReads, row: dict[str, Any], before: int | None) -> None:
    """The page's attempts, newest first: the one running now (from the row and its
    replica's heartbeat) on the first page, then those remembered (sql/030)."""
    rows = reads.attempts(row["id"], before, ATTEMPTS, ERROR_CHARS)
    for a in rows:
        a["worker"] = _worker(a["host"], a["pid"], a["slot"])
        a["duration_s"] = _span(a["started_at"], a["ended_at"])
        a["error_cut"] = (a["error_length"] or 0) > ERROR_CHARS
    if before is None and row.get("state") == "running":
        rows.insert(0, {
            "id": None, "number": row["attempt_count"], "outcome": "running",
            "error": None, "error_line": None, "error_cut": False,
            "started_at": row["last_attempted_at"], "ended_at": None,
            "worker": _worker(row["hostname"], row["pid"], row["slot"]),
            "duration_s": row.get("age_s"),
        })  # fmt: skip
    row["attempts"] = rows
    remembered = [a for a in rows if a["id"] is not None]
    row["attempts_total"] = reads.attempt_count(row["id"])
    row["attempts_capped"] = row["attempts_total"] >= reads.COUNT_CAP
    row["attempts_before"] = before
    row["attempts_next"] = remembered[-1]["id"] if len(remembered) == ATTEMPTS else None
    row["attempts_shown"] = ATTEMPTS


def _worker(host: str | None, pid: int | None, slot: int | None) -> str | None:
    """host:pid:slot, as `slotd result` and slotd.Attempt name a worker."""
    if host is None:
        return None
    return f"{host}:{pid}:{slot}" if slot is not None else f"{host}:{pid}"


def _span(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def _waits_for(row: dict[str, Any]) -> dict[str, Any] | None:
    """What a waiting task waits for (sql/072): an event (until its timeout, if any), the
    end of a durable sleep, or its parents."""
    if row["finished"] or row["state"] != "waiting":
        return None
    now, until = row["db_now"], row.get("wait_until")
    wake = {"at": until, "in": relative((until - now).total_seconds())} if until else None
    if row.get("wait_event"):
        return {"kind": "event", "event": row["wait_event"], "step": row["wait_step"], "wake": wake}
    if row.get("wait_step"):
        return {"kind": "sleep", "event": None, "step": row["wait_step"], "wake": wake}
    if row.get("sequence_waiting"):  # its turn in its sequence (sql/080)
        return {"kind": "sequence", "event": None, "step": None, "wake": None}
    return {"kind": "parents", "event": None, "step": None, "wake": None}


def _parent_means(state: str) -> str:
    """A parent's state as its dependant's page says it (a dead parent is never "not yet")."""
    if state in ("pending", "scheduled", "retrying", "waiting"):
        return f"{state}, not run yet"
    if state in ("failed", "cancelled", "expired"):
        return f"{state}: its dependants are cancelled"
    return "gone: purged" if state == "gone" else state


def batch(reads: DashboardReads, batch_id: int) -> dict[str, Any] | None:
    """A batch's page: its callback, its ends by state, its members that have a row."""
    found = reads.batch_graph(batch_id, BATCH_MEMBERS)
    if found is None:
        return None
    ended = {k: found[k] for k in ("succeeded", "failed", "cancelled", "expired")}
    found["ended"] = ended
    found["in_flight"] = max(found["total"] - sum(ended.values()), 0)
    found["shown"] = BATCH_MEMBERS
    return found


def _live_task(row: dict[str, Any]) -> None:
    row["payload_text"] = json.dumps(row["payload"], indent=2, sort_keys=True)
    now = row["db_now"]
    started = row["last_attempted_at"]
    row["age_s"] = (now - started).total_seconds() if started else None
    # slotd's one vocabulary of states (slotd/repository/states.py, fragment task_state).
    row["state"] = row["task_state"]
    # Its first remembered attempt, else the last one (a wait gives its attempt back, so a
    # task that ran and now waits counts none, yet it started).
    row["started_at"] = row["first_started_at"] or row["last_attempted_at"]
    if row["dead"]:
        row["due_in"] = None  # it never runs again unless retried
    elif row["run_at"] is None:  # its event, its sequence's turn or its parents
        row["due_in"] = listings.due_words(row)
    else:
        row["due_in"] = relative((row["run_at"] - now).total_seconds())


def schedules(reads: DashboardReads) -> dict[str, Any]:
    paused = [
        {
            "task type": row["task_type"],
            "paused by": row["paused_by"],
            "since": stamp(row["paused_at"]),
            "until": stamp(row["until"]) if row["until"] else "resumed",
            "time left": duration(row["remaining_s"]) if row["until"] else "–",
        }
        for row in reads.paused()
    ]
    out: dict[str, Any] = {"paused": _table(paused)}
    # Schedules are shown once the database has their table (a migration of their own).
    out["schedules"] = _schedules(reads) if "slotd_schedules" in reads.tables() else None
    return out


def _schedules(reads: DashboardReads) -> dict[str, Any]:
    # Next fire and lag computed as `slotd schedules` computes them: one definition.
    from slotd.commands.schedules import _report

    rows = []
    for row in map(_report, reads.schedules()):
        declared = ", ".join(f"{d['hostname']}:{d['pid']}" for d in row["declared_by"])
        rows.append(
            {
                "name": row["name"],
                "task type": row["task_type"],
                "when": f"{row['expression']} ({row['timezone']})",
                "catch up": row["catch_up"],
                "last fire": _stamp(row["last_fire"]),
                "next fire": _stamp(row["next_fire"]),
                "lag": None if row["lag_seconds"] is None else duration(row["lag_seconds"]),
                "declared by": declared or "nobody (orphaned)",
                "_lagging": (row["lag_seconds"] or 0) >= STARVED_S,
            }
        )
    return _table(rows)


def _stamp(value: datetime | None) -> str | None:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z") if value is not None else None


def _table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    columns: list[str] = []
    for row in rows:  # a key starting with _ marks the row, it is not a column
        columns += [c for c in row if c not in columns and not c.startswith("_")]
    return {"rows": rows, "columns": columns}
