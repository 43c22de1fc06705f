"""Every statement slotd runs against the queue. The SQL itself is in sql/; this module
loads it, binds parameters and says what a zero-row match means."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import psycopg

from slotd.errors import LeaseLost
from slotd.payload import encode
from slotd.registry import Registry, validate_type_name
from slotd.task import Task

WAKE_CHANNEL = "slotd_wake"
_BLOCK = re.compile(r"^-- (name|predicate|fragment): (\S+)\s*$", re.M)
_SPLICE = re.compile(r"\{(\w+)\}")

Executor = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncExecutor = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]


def sql_dir() -> Path:
    """sql/ next to the package in a checkout, slotd/sql inside an installed wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parent / "sql"):
        if (candidate / "queries.sql").exists():
            return candidate
    raise FileNotFoundError("slotd's sql/ directory is missing from this installation")


@cache
def statements() -> dict[str, str]:
    """queries.sql, plus queries_*.sql for optional integrations (slotd.contrib)."""
    folder = sql_dir()
    files = [folder / "queries.sql", *sorted(folder.glob("queries_*.sql"))]
    text = "\n".join(path.read_text() for path in files)
    blocks: dict[str, dict[str, str]] = {"name": {}, "predicate": {}, "fragment": {}}
    marks = list(_BLOCK.finditer(text))
    for mark, nxt in zip(marks, [*marks[1:], None], strict=True):
        body = text[mark.end() : nxt.start() if nxt else len(text)]
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        blocks[mark.group(1)][mark.group(2)] = "\n".join(lines).strip()
    predicates, fragments = blocks["predicate"], blocks["fragment"]

    def splice(sql: str) -> str:
        # A predicate goes in parenthesised, so it composes inside any boolean expression;
        # a fragment (shared CTEs) goes in as written.
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in fragments:
                return splice(fragments[name])
            return "(" + splice(predicates[name]) + ")"

        return _SPLICE.sub(one, sql)

    return {name: splice(sql) for name, sql in blocks["name"].items()}


def _sql(name: str) -> Any:
    # psycopg's LiteralString typing does not follow strings loaded from a file.
    return statements()[name]


def migrations() -> list[tuple[int, str, str]]:
    found = []
    for path in sorted(sql_dir().glob("[0-9][0-9][0-9]_*.sql")):
        found.append((int(path.name[:3]), path.stem, path.read_text()))
    return found


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the numbered migrations not yet recorded, all in one transaction that first
    takes a transaction-scoped advisory lock and reads what is applied under it: two hosts
    migrating at once take turns, the second finds nothing to do, and a failing migration
    leaves the schema as it was. Transaction-scoped, not a session lock: behind a
    transaction-mode pooler a session lock and its unlock can land on different server
    sessions and the lock stays held in the pool; this one ends with its COMMIT."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute(_sql("migrate_lock"))
        conn.execute(_sql("migrate_init"))
        done = {row[0] for row in conn.execute(_sql("migrate_applied"))}
        for version, name, body in migrations():
            if version in done:
                continue
            conn.execute(body)  # type: ignore[arg-type]
            conn.execute(_sql("migrate_record"), {"version": version, "name": name})
            applied_now.append(name)
    return applied_now


def _json_object(payload: Mapping[str, Any] | None, task_type: str) -> str:
    return encode(payload, f"task {task_type!r}")


def _seconds(delay: timedelta | float | int | None) -> float:
    if delay is None:
        return 0.0
    return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


PRIORITY_RANGE = range(-100, 101)
# The largest head start is this many steps: what bounds a scan in delivery order.
PRIORITY_SPAN = 100


@dataclass(frozen=True)
class NewTask:
    task_type: str
    payload: Mapping[str, Any] | None = None
    delay: timedelta | float | None = None
    key: str | None = None
    priority: int = 0
    group: str | None = None


def _priority(value: object, task_type: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITY_RANGE:
        raise ValueError(
            f"task {task_type!r}: priority must be a whole number from -100 to 100, got {value!r}"
        )
    return value


def enqueue_params(
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int = 20,
    explicit: bool = False,
    priority_step: timedelta = timedelta(seconds=1),
) -> dict[str, Any] | None:
    """The `enqueue` statement's parameters, or None for no items. The one place producer
    input is validated (the sync and asyncio paths share it): everything is checked before
    anything is sent, so bad input leaves the caller's transaction untouched. A task of
    priority p is ordered as if it had become due p x priority_step earlier (the
    producer's step, stamped on the row)."""
    rows = [item if isinstance(item, NewTask) else NewTask(*item) for item in items]
    if not rows:
        return None
    step = priority_step.total_seconds()
    types, payloads, keys, delays, priorities, groups, leads = [], [], [], [], [], [], []
    for row in rows:
        types.append(validate_type_name(row.task_type))
        payloads.append(_json_object(row.payload, row.task_type))
        if row.key is not None and not isinstance(row.key, str):
            raise TypeError(f"task {row.task_type!r}: key must be a string")
        if row.group is not None and not isinstance(row.group, str):
            raise TypeError(f"task {row.task_type!r}: group must be a string")
        keys.append(row.key)
        delays.append(_seconds(row.delay))
        priorities.append(_priority(row.priority, row.task_type))
        groups.append(row.group)
        leads.append(priorities[-1] * step)
    return {
        "types": types,
        "payloads": payloads,
        "keys": keys,
        "delays": delays,
        "priorities": priorities,
        "groups": groups,
        "leads": leads,
        "max_attempts": max_attempts,
        "explicit": explicit,
    }


def enqueue_many(
    target: Executor,
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int = 20,
    explicit: bool = False,
    priority_step: timedelta = timedelta(seconds=1),
) -> list[int]:
    """Insert tasks inside the caller's transaction and return their ids, in order; a key
    with a live row returns that row's id. `explicit=False`: the claiming worker stamps
    its own max_attempts over this one."""
    params = enqueue_params(
        items, max_attempts=max_attempts, explicit=explicit, priority_step=priority_step
    )
    if params is None:
        return []
    result = target.execute(_sql("enqueue"), params).fetchall()
    ids: list[int] = []
    for index, (_ord, task_id, task_type, key) in enumerate(result):
        for _ in range(_KEY_TRIES):
            if task_id is not None:
                break
            # Met a concurrent or same-batch enqueue of the same key: a new statement sees
            # that row, unless it was claimed and finished meanwhile; then insert ours.
            found = target.execute(_sql("live_by_key"), {"task_type": task_type, "key": key})
            row = found.fetchone()
            task_id = row[0] if row else _enqueue_one(target, params, index)
        ids.append(_found(task_id, task_type, key))
    return ids


def _enqueue_one(target: Executor, params: dict[str, Any], index: int) -> int | None:
    return target.execute(_sql("enqueue"), _one(params, index)).fetchall()[0][1]


async def enqueue_many_async(
    target: AsyncExecutor,
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int = 20,
    explicit: bool = False,
    priority_step: timedelta = timedelta(seconds=1),
) -> list[int]:
    """enqueue_many on a psycopg AsyncConnection or AsyncCursor: the same statement."""
    params = enqueue_params(
        items, max_attempts=max_attempts, explicit=explicit, priority_step=priority_step
    )
    if params is None:
        return []
    result = await (await target.execute(_sql("enqueue"), params)).fetchall()
    ids: list[int] = []
    for index, (_ord, task_id, task_type, key) in enumerate(result):
        for _ in range(_KEY_TRIES):
            if task_id is not None:
                break
            found = await target.execute(_sql("live_by_key"), {"task_type": task_type, "key": key})
            row = await found.fetchone()
            if row:
                task_id = row[0]
            else:
                again = await target.execute(_sql("enqueue"), _one(params, index))
                task_id = (await again.fetchall())[0][1]
        ids.append(_found(task_id, task_type, key))
    return ids


# A keyed row that keeps finishing between our two statements, this many times in a row,
# is not a race any more but a bug worth an error.
_KEY_TRIES = 5


def _one(params: dict[str, Any], index: int) -> dict[str, Any]:
    """The enqueue parameters for input row `index` alone."""
    return {k: v[index : index + 1] if isinstance(v, list) else v for k, v in params.items()}


def _found(task_id: int | None, task_type: str, key: str | None) -> int:
    if task_id is None:
        raise RuntimeError(f"task {task_type!r} key {key!r}: no live row and no insert")
    return task_id


@dataclass(frozen=True)
class Claimed:
    """A row this worker holds a lease on, with the database's own stamps."""

    id: int
    task_type: str
    payload: dict[str, Any]
    key: str | None
    run_at: datetime
    attempt: int
    max_attempts: int
    token: uuid.UUID
    lease_expires_at: datetime
    claimed_at: datetime

    @property
    def final_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def task(self) -> Task:
        return Task(self.id, self.task_type, self.payload, self.attempt, self.key, self.run_at)

    def deadline(self, margin: timedelta) -> datetime:
        return self.lease_expires_at - margin


@dataclass(frozen=True)
class Failure:
    attempt: int
    max_attempts: int
    run_at: datetime

    @property
    def dead(self) -> bool:
        return self.attempt >= self.max_attempts


ERROR_LIMIT = 8000


def storable(text: str, limit: int = ERROR_LIMIT) -> str:
    """Error text PostgreSQL will take, whatever a handler put in its exception: NUL
    escaped (a text column cannot hold one), lone surrogates escaped (not UTF-8), and at
    most `limit` characters, keeping the head and the tail, where a traceback names its
    exception."""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head - 40
    return f"{text[:head]}\n... [{len(text) - head - tail} characters cut] ...\n{text[-tail:]}"


def _interval(value: timedelta) -> str:
    return f"{int(value.total_seconds() * 1000)}ms"


Limits = Mapping[str, tuple[int | None, int | None]]


def limit_params(limits: Limits) -> dict[str, Any]:
    """The within_limits predicate's parallel arrays; empty for an unlimited registry."""
    names = sorted(limits)
    return {
        "limited": names,
        "max_running": [limits[n][0] for n in names],
        "max_per_group": [limits[n][1] for n in names],
        "settling": None,
        "settling_token": None,
    }


def id_array(ids: Sequence[int]) -> str:
    """The candidate ids as a bigint[] literal: on every claim, so no per-element checks."""
    return "{" + ",".join(map(str, ids)) + "}"


def array_literal(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal of ints, floats, strings or None, for a parameter the
    statement casts (`%(ids)s::bigint[]`)."""
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        elif isinstance(v, str):
            parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            parts.append(repr(v) if isinstance(v, float) else str(int(v)))
    return "{" + ",".join(parts) + "}"


class Repository:
    """The queue on one worker's connections: discovery on the read lane, claims and
    fenced settlements on the write lane, each write bounded by SET LOCAL timeouts."""

    def __init__(
        self,
        write: psycopg.Connection[Any],
        read: psycopg.Connection[Any] | None = None,
        *,
        lease_margin: timedelta = timedelta(seconds=30),
        max_attempts: int = 20,
        backoff_base: timedelta = timedelta(seconds=15),
        backoff_cap: timedelta = timedelta(minutes=10),
        backoff_jitter: float = 0.1,
        statement_timeout: timedelta = timedelta(seconds=30),
        lock_timeout: timedelta = timedelta(seconds=5),
        synchronous_commit: bool = True,
        priority_step: timedelta = timedelta(seconds=1),
    ) -> None:
        self.write = write
        self.lead_s = PRIORITY_SPAN * priority_step.total_seconds()
        # The type of every candidate of the last discovery: a claim locks the limits of
        # the limited types among its candidates only, so unlimited work never waits.
        self._candidate_types: dict[int, str] = {}
        self.synchronous_commit = synchronous_commit
        self._claim_arrays: tuple[Registry, list[str], dict[str, Any]] | None = None
        self.read = read or write
        self.lease_margin = lease_margin
        self.max_attempts = max_attempts
        self.backoff_cap = backoff_cap
        self._backoff = {
            "base_s": backoff_base.total_seconds(),
            "cap_s": backoff_cap.total_seconds(),
            "jitter": backoff_jitter,
        }
        self.session_bound = False  # see bind_session
        self._cursor: psycopg.Cursor[Any] | None = None
        self._bounds = {
            "statement_timeout": _interval(statement_timeout),
            "lock_timeout": _interval(lock_timeout),
        }

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        write: psycopg.Connection[Any],
        read: psycopg.Connection[Any] | None = None,
    ) -> Repository:
        return cls(
            write,
            read,
            lease_margin=settings.lease_margin,
            max_attempts=settings.max_attempts,
            backoff_base=settings.backoff_base,
            backoff_cap=settings.backoff_cap,
            backoff_jitter=settings.backoff_jitter,
            statement_timeout=settings.statement_timeout,
            lock_timeout=settings.lock_timeout,
            synchronous_commit=settings.synchronous_commit,
            priority_step=settings.priority_step,
        )

    def bind_session(self) -> None:
        """Carry the write bounds on this connection's session instead of in every write:
        one statement per write instead of two (psycopg's pipeline and the bound statement
        were a third of a slot's CPU per task). Only for a connection of our own that goes
        straight to the server (a slot's): behind a transaction-mode pooler a session
        setting lands on whichever server connection ran it, so there every write keeps its
        own SET LOCAL. The session is the connection's: a reconnect binds again."""
        conn = self.write
        name = "bind_session_async" if not self.synchronous_commit else "bind_session"
        conn.execute(_sql(name), self._bounds)
        self.session_bound = True
        self._cursor = conn.cursor() if conn.autocommit else None

    @contextmanager
    def _bounded(self, lock_types: Sequence[str] = ()) -> Iterator[psycopg.Connection[Any]]:
        conn = self.write
        bound = _sql("bound_async" if not self.synchronous_commit else "bound")
        if not conn.autocommit:  # a caller's transaction: a savepoint inside it, as ever
            with conn.pipeline(), conn.transaction():
                conn.execute(bound, self._bounds)
                if lock_types:
                    conn.execute(_sql("claim_lock"), {"lock_types": list(lock_types)})
                yield conn
            return
        # One pipeline, one Sync, no BEGIN/COMMIT: the server runs everything before a Sync
        # as one implicit transaction and commits it at the Sync, so the bound is local to
        # exactly this write (behind a transaction-mode pooler too). psycopg's explicit
        # transaction inside a pipeline costs extra syncs: tests/bench measured 1.9 ms vs
        # 1.0 ms per task (discover/claim/dequeue, serial, fsync on).
        with conn.pipeline():
            if not self.session_bound:
                conn.execute(bound, self._bounds)
            if lock_types:  # same transaction, before the claim: see claim_lock
                conn.execute(_sql("claim_lock"), {"lock_types": list(lock_types)})
            yield conn

    def _write(
        self, name: str, params: Mapping[str, Any], lock_types: Sequence[str] = ()
    ) -> tuple[int, list[tuple[Any, ...]]]:
        cur: psycopg.Cursor[Any]
        if self._cursor is not None and not lock_types:
            # A bound session's one statement: on the connection's own cursor (a new cursor
            # per execute and the context manager were a quarter of a settlement's CPU).
            cur = self._cursor
            cur.execute(_sql(name), params)
        else:
            with self._bounded(lock_types) as conn:
                cur = conn.execute(_sql(name), params)
        # Not `cur.description`: it builds a Column object per column on every call.
        result = cur.pgresult
        rows = cur.fetchall() if result is not None and result.nfields else []
        return cur.rowcount, rows

    # discovery and claim

    @property
    def has_read_lane(self) -> bool:
        return self.read is not self.write

    def discover(
        self,
        types: Sequence[str],
        limit: int = 20,
        limits: Limits | None = None,
        on_primary: bool = False,
    ) -> list[int]:
        """Candidate ids in delivery order (ordering key, then id), passing over rows that
        their type's or group's limit holds back right now; from the read lane, or from the
        primary after a read-lane discovery whose candidates were all gone there."""
        params = {
            "types": list(types),
            "limit": limit,
            "lead_s": self.lead_s,
            **limit_params(limits or {}),
        }
        conn = self.write if on_primary else self.read
        rows = conn.execute(_sql("discover"), params).fetchall()
        self._candidate_types = {task_id: task_type for task_id, task_type in rows}
        return [row[0] for row in rows]

    def _claim_params(self, ids: Sequence[int], registry: Registry) -> dict[str, Any]:
        # Arrays go as array literals (text the statement casts): psycopg's list adaptation
        # walks every element in Python on every claim, 74 us per claim against 12 us for
        # these strings (tests/bench/cpu_per_task.py). The registry's arrays change only
        # when a type is registered, so they are built once per registry and type list.
        types = registry.types
        cached = self._claim_arrays
        if cached is None or cached[0] is not registry or cached[1] != types:
            arrays = {
                "types": types,
                "ceilings_s": registry.ceilings_seconds,
                "max_attempts": registry.max_attempts(self.max_attempts),
                **limit_params(registry.concurrency_limits),
            }
            literals = {k: v if v is None else array_literal(v) for k, v in arrays.items()}
            cached = self._claim_arrays = (registry, types, literals)
        return {
            "ids": id_array(ids),
            **cached[2],
            "margin_s": self.lease_margin.total_seconds(),
        }

    def _lock_types(self, ids: Sequence[int], registry: Registry) -> list[str]:
        """The limited types this claim may pick: those among the candidates when the last
        discovery found them all, else (ids from elsewhere) every limited type served."""
        limited = registry.concurrency_limits
        if not limited:
            return []
        known = self._candidate_types
        if all(task_id in known for task_id in ids):
            return sorted({known[i] for i in ids} & limited.keys())
        return sorted(limited)

    def claim(self, ids: Sequence[int], registry: Registry) -> Claimed | None:
        if not ids:
            return None
        lock = self._lock_types(ids, registry)
        _, rows = self._write("claim", self._claim_params(ids, registry), lock)
        return Claimed(*rows[0]) if rows else None

    # fenced settlements

    def dequeue(self, task_id: int, token: uuid.UUID | None) -> None:
        count, _ = self._write("dequeue", {"id": task_id, "token": token})
        if count == 0:
            raise LeaseLost(f"task {task_id}: dequeue refused, the lease is not ours")

    def dequeue_and_claim(
        self, task_id: int, token: uuid.UUID | None, ids: Sequence[int], registry: Registry
    ) -> Claimed | None:
        """Dequeue a finished task and claim the next of `ids` in one statement: one round
        trip, one commit. A refused dequeue raises LeaseLost carrying the new claim."""
        params = {
            **self._claim_params(ids, registry),
            "id": task_id,
            "done_token": token,
            # The settled row's place is free for the claim riding on its settlement.
            "settling": task_id,
            "settling_token": token,
        }
        _, rows = self._write("dequeue_claim", params, self._lock_types(ids, registry))
        dequeued, *claim = rows[0]
        claimed = Claimed(*claim) if claim[0] is not None else None
        if not dequeued:
            raise LeaseLost(f"task {task_id}: dequeue refused, the lease is not ours", claimed)
        return claimed

    def record_failure(
        self,
        task_id: int,
        token: uuid.UUID,
        error: str,
        *,
        backoff_base: timedelta | None = None,
        backoff_cap: timedelta | None = None,
    ) -> Failure:
        """Back off and keep the error. `backoff_base` / `backoff_cap`: the type's own,
        else the worker's."""
        params = {"id": task_id, "token": token, "error": storable(error), **self._backoff}
        if backoff_base is not None:
            params["base_s"] = backoff_base.total_seconds()
        if backoff_cap is not None:
            params["cap_s"] = backoff_cap.total_seconds()
        _, rows = self._write("record_failure", params)
        if not rows:
            raise LeaseLost(f"task {task_id}: failure refused, the lease is not ours")
        return Failure(*rows[0])

    def advance_cursor(
        self, task_id: int, token: uuid.UUID, payload: Mapping[str, Any] | str
    ) -> bool:
        """`payload` is the new payload, or its JSON text already encoded (by the handler's
        Context, in the handler's own frame)."""
        body = payload if isinstance(payload, str) else encode(payload, "cursor")
        count, _ = self._write("advance_cursor", {"id": task_id, "token": token, "payload": body})
        return count == 1

    def release(self, task_id: int, token: uuid.UUID, reason: str) -> bool:
        params = {"id": task_id, "token": token, "reason": storable(reason)}
        _, rows = self._write("release", params)
        return len(rows) == 1

    def settle_cancelled(self, task_id: int, token: uuid.UUID) -> bool:
        count, _ = self._write("settle_cancelled", {"id": task_id, "token": token})
        return count == 1

    def cancel_reason(self, task_id: int, token: uuid.UUID) -> str | None:
        """The cancel's reason when an operator cancelled this lease's task, else None. On
        the write lane: a replica's lag must not hide a cancel."""
        row = self.write.execute(_sql("cancelled_lease"), {"id": task_id, "token": token})
        found = row.fetchone()
        return str(found[0]) if found else None

    # fleet view and maintenance (autocommit statements on the write lane)

    def gauges(self, limits: Limits | None = None) -> dict[str, Any]:
        """Fleet gauges. `limits`: tasks held back only by these limits are not counted as
        waiting in oldest_due_seconds (they wait on their own limit, not on the fleet)."""
        out: dict[str, Any] = {
            "pending": {},
            "running": {},
            "dead": {},
            "paused": {},
            "oldest_due_seconds": 0.0,
        }
        params = {"lead_s": self.lead_s, **limit_params(limits or {})}
        for kind, task_type, value in self.read.execute(_sql("gauges"), params).fetchall():
            if kind == "oldest_due":
                out["oldest_due_seconds"] = float(value or 0.0)
            else:
                bucket = out[kind]
                bucket[task_type] = bucket.get(task_type, 0) + int(value)
        return out

    def dead_list(
        self,
        task_type: str | None = None,
        ids: Sequence[int] | None = None,
        limit: int = 100,
        key: str | None = None,
        key_types: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """Newest first; `key` is searched among `key_types` (or `task_type`)."""
        params = {
            "task_type": task_type,
            "ids": list(ids) if ids else None,
            "limit": limit,
            "key": key,
            "key_types": [task_type] if task_type else list(key_types),
        }
        return _dicts(self.read.execute(_sql("dead_list"), params))

    def dead_count(
        self,
        task_type: str | None = None,
        ids: Sequence[int] | None = None,
        older_than: timedelta | None = None,
    ) -> int:
        params = {
            "task_type": task_type,
            "ids": list(ids) if ids else None,
            "older_than_s": older_than.total_seconds() if older_than else None,
        }
        return int(self.read.execute(_sql("dead_count"), params).fetchone()[0])  # type: ignore[index]

    def dead_retry_batch(
        self, task_type: str | None = None, ids: Sequence[int] | None = None, batch: int = 1000
    ) -> list[int]:
        params = {"task_type": task_type, "ids": list(ids) if ids else None, "batch": batch}
        _, rows = self._write("dead_retry", params)
        return [row[0] for row in rows]

    def dead_purge_batch(
        self,
        task_type: str | None = None,
        ids: Sequence[int] | None = None,
        older_than: timedelta | None = None,
        batch: int = 5000,
    ) -> int:
        params = {
            "task_type": task_type,
            "ids": list(ids) if ids else None,
            "older_than_s": older_than.total_seconds() if older_than else None,
            "batch": batch,
        }
        count, _ = self._write("dead_purge", params)
        return count

    def prune_dead(self, retention: timedelta, batch: int = 5000) -> int:
        """Retention: dead letters whose last attempt is older than the window, in batches
        so a million-row backlog never holds one long transaction."""
        total = 0
        while True:
            pruned = self.dead_purge_batch(older_than=retention, batch=batch)
            total += pruned
            if pruned < batch:
                return total

    def elect_chore(self, chore: str, period: timedelta) -> bool:
        """True on the one replica that runs `chore` this period (e.g. hourly retention)."""
        params = {"chore": chore, "period_s": period.total_seconds() * 0.95}
        return bool(self._write("elect_chore", params)[1])

    def heartbeat(
        self,
        replica_id: str,
        hostname: str,
        pid: int,
        slots: int,
        task_types: list[str],
        leases: Mapping[int, int] | None = None,
        limits: Limits | None = None,
    ) -> None:
        """`leases`: task id -> the slot number holding it, for the dashboard."""
        params = {
            "replica_id": replica_id,
            "hostname": hostname,
            "pid": pid,
            "slots": slots,
            "task_types": task_types,
            "leases": json.dumps({str(k): v for k, v in (leases or {}).items()}),
            "limits": json.dumps({k: list(v) for k, v in (limits or {}).items()}),
        }
        # Bounded like every queue write: a heartbeat stuck behind a lock must end.
        self._write("replica_heartbeat", params)

    def record_outcomes(self, rows: Sequence[tuple[datetime, str, str, int]]) -> None:
        """Add (minute, type, outcome, count) rows to the dashboard's last-hour record."""
        if not rows:
            return
        minutes, types, outcomes, counts = (list(col) for col in zip(*rows, strict=True))
        params = {"minutes": minutes, "types": types, "outcomes": outcomes, "counts": counts}
        self.write.execute(_sql("record_outcomes"), params)

    def replica_gone(self, replica_id: str) -> None:
        self._write("replica_gone", {"replica_id": replica_id})

    def replicas(self) -> list[dict[str, Any]]:
        return _dicts(self.write.execute(_sql("replicas")))

    # periodic schedules (sql/queries_schedules.sql)

    def declare_schedules(
        self,
        replica_id: str,
        hostname: str,
        pid: int,
        schedules: Sequence[Any],
        offset: float = 0.0,
    ) -> tuple[list[tuple[str, datetime | None, datetime | None]], datetime]:
        """Create the rows of `schedules` (slotd.schedule.Schedule) that do not exist and
        record that this replica declares them. Returns (name, anchor_at, last_fire_at)
        per schedule -- anchor None: created concurrently, declare again -- and the
        database's clock (plus `offset` seconds: the pytest plugin's advanced time)."""
        params = {
            "offset_s": offset,
            "names": [sc.name for sc in schedules],
            "types": [sc.task_type for sc in schedules],
            "expressions": [sc.expression for sc in schedules],
            "zones": [sc.timezone for sc in schedules],
            "catch_ups": [sc.catch_up for sc in schedules],
            "replica_id": replica_id,
            "hostname": hostname,
            "pid": pid,
        }
        _, rows = self._write("schedules_declare", params)
        now = rows[0][3] if rows else None
        return [(name, anchor, last) for name, anchor, last, _ in rows], now  # type: ignore[return-value]

    def fire_schedules(
        self,
        advances: Sequence[tuple[str, datetime | None, datetime]],
        fires: Sequence[tuple[Any, datetime]],
        max_attempts: int,
        offset: float = 0.0,
    ) -> list[tuple[str, bool, datetime | None, list[int], datetime]]:
        """Advance each (name, expected last fire, new last fire) by compare-and-set and
        insert the tasks of `fires` ((Schedule, fire time), oldest first) of the schedules
        that advanced, in one statement. Returns per schedule (name, advanced, its last
        fire now, the ids enqueued, the database's clock); a name missing from the result
        has no row (pruned): declare again."""
        params = {
            "names": [name for name, _, _ in advances],
            "expected": [expected for _, expected, _ in advances],
            "new_last": [new_last for _, _, new_last in advances],
            "f_names": [sc.name for sc, _ in fires],
            "f_at": [at for _, at in fires],
            "f_types": [sc.task_type for sc, _ in fires],
            "f_payloads": [sc.payload_json for sc, _ in fires],
            "f_keys": [sc.key_for(at) for sc, at in fires],
            "f_skip_live": [sc.overlap == "skip" for sc, _ in fires],
            "max_attempts": max_attempts,
            "offset_s": offset,
        }
        _, rows = self._write("schedules_fire", params)
        return [(name, ours, last, list(ids), now) for name, ours, last, ids, now in rows]

    def schedules_gone(self, replica_id: str) -> None:
        self.write.execute(_sql("schedules_gone"), {"replica_id": replica_id})

    def schedules_overview(self) -> list[dict[str, Any]]:
        cur = self.write.execute(_sql("schedules_overview"))
        names = [col.name for col in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def prune_schedules(self) -> list[str]:
        _, rows = self._write("schedules_prune", {})
        return sorted(row[0] for row in rows)

    # test modes only

    def task_view(self, view: str, task_type: str | None = None) -> list[tuple[Any, ...]]:
        """'pending', 'running' or 'dead': (id, type, payload, attempts, key, run_at,
        last_error, dead) rows."""
        params = {"view": view, "task_type": task_type}
        return self.write.execute(_sql("task_view"), params).fetchall()

    def lease_of(self, task_id: int) -> tuple[uuid.UUID | None, bool] | None:
        row = self.write.execute(_sql("lease_of"), {"id": task_id}).fetchone()
        return (row[0], bool(row[1])) if row else None

    def shift_time(self, seconds: float) -> None:
        self.write.execute(_sql("set_time_offset"), {"seconds": seconds})

    def expire_leases(self) -> int:
        return self.write.execute(_sql("expire_leases")).rowcount

    # ops

    def oldest_due_by_type(self) -> dict[str, float]:
        """Seconds the oldest claimable task of each type has been due (types with none
        are absent)."""
        rows = self.read.execute(_sql("oldest_due_by_type"), {"lead_s": self.lead_s}).fetchall()
        return {task_type: float(seconds) for task_type, seconds in rows}


class DashboardReads:
    """The web dashboard's statements (slotd.web), on one connection. Every one is bounded
    by a cap or a limit; the counts use the gauges' predicates."""

    COUNT_CAP = 10_000
    OPTIONAL_TABLES = ("slotd_schedules",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    @staticmethod
    def prepare(conn: psycopg.Connection[Any], statement_timeout: timedelta) -> None:
        """Once per pooled connection: no dashboard statement runs longer than this."""
        conn.execute(_sql("dash_read_timeout"), {"statement_timeout": _interval(statement_timeout)})

    def replicas(self) -> list[dict[str, Any]]:
        return Repository(self.conn).replicas()

    def dead_list(
        self, task_type: str | None, *, limit: int, **search: Any
    ) -> list[dict[str, Any]]:
        return Repository(self.conn).dead_list(task_type, limit=limit, **search)

    def types(self, limit: int = 500) -> list[str]:
        return [row[0] for row in self.conn.execute(_sql("dash_types"), {"limit": limit})]

    def counts(self, types: Sequence[str]) -> list[dict[str, Any]]:
        params = {"types": list(types), "cap": self.COUNT_CAP}
        return _dicts(self.conn.execute(_sql("dash_counts"), params))

    def outcomes(self) -> list[dict[str, Any]]:
        return _dicts(self.conn.execute(_sql("dash_outcomes")))

    def running(self, lease_margin: timedelta, limit: int = 200) -> list[dict[str, Any]]:
        params = {"margin_s": lease_margin.total_seconds(), "limit": limit}
        return _dicts(self.conn.execute(_sql("dash_running"), params))

    def task(self, task_id: int) -> dict[str, Any] | None:
        rows = _dicts(self.conn.execute(_sql("dash_task"), {"id": task_id}))
        return rows[0] if rows else None

    def dead_count(self, task_type: str | None) -> int:
        params = {"task_type": task_type, "cap": self.COUNT_CAP}
        return int(self.conn.execute(_sql("dash_dead_count"), params).fetchone()[0])  # type: ignore[index]

    def tables(self) -> set[str]:
        cur = self.conn.execute(_sql("dash_tables"), {"names": list(self.OPTIONAL_TABLES)})
        return {row[0] for row in cur}

    def schedules(self) -> list[dict[str, Any]]:
        """`slotd schedules`' statement (one row per schedule, a handful)."""
        return Repository(self.conn).schedules_overview()

    def rows_of(self, table: str, limit: int = 200) -> list[dict[str, Any]]:
        """An optional capability's table, whatever its columns (only OPTIONAL_TABLES)."""
        name = {"slotd_schedules": "dash_schedules"}[table]
        return [row[0] for row in self.conn.execute(_sql(name), {"limit": limit})]

    def paused(self) -> list[dict[str, Any]]:
        """The types paused now (`slotd pause`), as `slotd status` lists them."""
        return paused_types(self.conn)


def _dicts(cur: Any) -> list[dict[str, Any]]:
    names = [col.name for col in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def execute(target: Executor, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Run a named statement from sql/ and return the cursor: for integrations whose
    statements live in sql/queries_*.sql."""
    return target.execute(_sql(name), params)


def schema_present(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(_sql("schema_present")).fetchone()
    return bool(row and row[0])


def ping(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_sql("ping"))


def create_database(conn: psycopg.Connection[Any], name: str, template: str | None = None) -> bool:
    """CREATE DATABASE (a copy of `template` when given) unless it exists; True if created.
    For the embedded server and the throwaway test servers, on an autocommit connection."""
    if conn.execute(_sql("database_exists"), {"name": name}).fetchone():
        return False
    from psycopg import sql

    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    conn.execute(statement)
    return True


def waiting_for(conn: psycopg.Connection[Any], holder: int) -> list[int]:
    """Sessions waiting for a lock held by session `holder`."""
    return [row[0] for row in conn.execute(_sql("waiting_for"), {"holder": holder})]


def cancel_backend(conn: psycopg.Connection[Any], pid: int) -> None:
    conn.execute(_sql("cancel_backend"), {"pid": pid})


def listen(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_sql("listen"))


# operator control: cancel, pause, resume (in the caller's transaction, like enqueue)

CONTROL_CHANNEL = "slotd_control"


@dataclass(frozen=True)
class CancelledTask:
    id: int
    task_type: str
    running: bool  # under a live lease: its replica was told to stop it


def cancel_tasks(
    target: Executor,
    *,
    by: str,
    ids: Sequence[int] | None = None,
    task_type: str | None = None,
    key: str | None = None,
    batch: int = 1000,
) -> list[CancelledTask]:
    """Cancel up to `batch` live tasks matching every filter given; returns those cancelled
    (a task that finished, is dead or was already cancelled is not among them)."""
    params = {
        "ids": list(ids) if ids else None,
        "task_type": task_type,
        "key": key,
        "by": by,
        "batch": batch,
    }
    rows = target.execute(_sql("cancel"), params).fetchall()
    return [CancelledTask(*row) for row in rows]


def pause_type(
    target: Executor,
    task_type: str,
    *,
    by: str,
    until: datetime | None = None,
    for_seconds: float | None = None,
) -> dict[str, Any]:
    params = {"task_type": task_type, "until": until, "for_s": for_seconds, "by": by}
    cur = target.execute(_sql("pause"), params)
    names = [col.name for col in cur.description or []]
    return dict(zip(names, cur.fetchone() or (), strict=True))


def resume_type(target: Executor, task_type: str, *, by: str) -> bool | None:
    """True: it was paused; False: its pause had already ended; None: it was never paused."""
    row = target.execute(_sql("resume"), {"task_type": task_type, "by": by}).fetchone()
    return None if row is None else bool(row[0])


def paused_types(target: Executor) -> list[dict[str, Any]]:
    cur = target.execute(_sql("paused_types"))
    names = [col.name for col in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def listen_control(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_sql("listen_control"))


def notify_selftest(conn: psycopg.Connection[Any], payload: str) -> None:
    conn.execute(_sql("notify_selftest"), {"payload": payload})


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute(_sql("backend_pid")).fetchone()[0])  # type: ignore[index]
