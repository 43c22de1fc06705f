"""A worker's connections as the repository uses them: discovery on the read lane, every
queue write on the write lane, bounded by SET LOCAL timeouts (or by the session, once
bound). The repository's concerns (slotd.repository) all build on this one base."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Self

import psycopg

from slotd.repository.named import _interval, _sql, resolve_schema
from slotd.repository.producing import PRIORITY_SPAN


class Lanes:
    """The write lane, the read lane (the write lane when there is none) and the worker's
    settings every statement of the repository reads."""

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
        schema: str | None = None,
    ) -> None:
        self.write = write
        # Every statement of these lanes names this schema (None: SLOTD_SCHEMA, else public).
        self.schema = resolve_schema(schema)
        self.lead_s = PRIORITY_SPAN * priority_step.total_seconds()
        # The type of every candidate of the last discovery: a claim locks the limits of
        # the limited types among its candidates only, so unlimited work never waits.
        self._candidate_types: dict[int, str] = {}
        # From the last discovery (QueueProtocol.discover): seconds until a served type has
        # room in its full rate window or its next row not yet due is due (the slot's next
        # wake when it found nothing), and until the soonest expiry (the next sweep).
        self.wake_in_s: float | None = None
        self.sweep_in_s: float | None = None
        self.synchronous_commit = synchronous_commit
        self._claim_arrays: Any = None  # the registry's ClaimShape (repository.queue)
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
        # Who runs the attempts this repository settles (slotd_attempts, sql/030): the host,
        # this process, and the slot's number when a slot owns it (slot/connections.py).
        self.host = socket.gethostname()
        self.slot: int | None = None
        self.pid: int | None = None  # a slot's: its replica's (the supervisor's) pid
        # SLOTD_KEEP_HISTORY: how long a success of a type without keep_history stays
        # answerable (None: not at all, the plain path).
        self.keep_history_s: float | None = None
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
    ) -> Self:
        repo = cls(
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
            schema=getattr(settings, "schema", None),
        )
        history = getattr(settings, "keep_history", None)
        repo.keep_history_s = history.total_seconds() if history else None
        return repo

    def bind_session(self) -> None:
        """Carry the write bounds on this connection's session instead of in every write:
        one statement per write instead of two (psycopg's pipeline and the bound statement
        were a third of a slot's CPU per task). Only for a connection of our own that goes
        straight to the server (a slot's): behind a transaction-mode pooler a session
        setting lands on whichever server connection ran it, so there every write keeps its
        own SET LOCAL. The session is the connection's: a reconnect binds again."""
        conn = self.write
        name = "bind_session_async" if not self.synchronous_commit else "bind_session"
        conn.execute(_sql(name, self.schema), self._bounds)
        self.session_bound = True
        self._cursor = conn.cursor() if conn.autocommit else None

    @contextmanager
    def _bounded(
        self,
        lock_types: Sequence[str] = (),
        before: tuple[str, Mapping[str, Any]] | None = None,
    ) -> Iterator[psycopg.Connection[Any]]:
        """`before`: a named statement (and its parameters) run first in the same
        transaction, in its own statement (a lock whose wait must end before the next
        statement's snapshot is taken: `event_lock`)."""
        conn = self.write
        bound = _sql("bound_async" if not self.synchronous_commit else "bound", self.schema)
        if not conn.autocommit:  # a caller's transaction: a savepoint inside it, as ever
            with conn.pipeline(), conn.transaction():
                conn.execute(bound, self._bounds)
                if lock_types:
                    conn.execute(_sql("claim_lock", self.schema), {"lock_types": list(lock_types)})
                if before is not None:
                    conn.execute(_sql(before[0], self.schema), before[1])
                yield conn
            return
        # One pipeline, one Sync, no BEGIN/COMMIT: the server runs everything before a Sync
        # as one implicit transaction and commits it at the Sync, so the bound is local to
        # exactly this write (behind a transaction-mode pooler too). psycopg's explicit
        # transaction inside a pipeline costs extra syncs: tests/bench measured 1.9 ms vs
        # 1.0 ms per task (discover/claim/dequeue, serial, fsync on).
        with conn.pipeline():
            if not self.session_bound:
                # A pooled session's isolation is not ours to set: this write's own.
                conn.execute(_sql("read_committed_local", self.schema))
                conn.execute(bound, self._bounds)
            if lock_types:  # same transaction, before the claim: see claim_lock
                conn.execute(_sql("claim_lock", self.schema), {"lock_types": list(lock_types)})
            if before is not None:
                conn.execute(_sql(before[0], self.schema), before[1])
            yield conn

    def _write(
        self,
        name: str,
        params: Mapping[str, Any],
        lock_types: Sequence[str] = (),
        before: tuple[str, Mapping[str, Any]] | None = None,
    ) -> tuple[int, list[tuple[Any, ...]]]:
        cur: psycopg.Cursor[Any]
        if self._cursor is not None and not lock_types and before is None:
            # A bound session's one statement: on the connection's own cursor (a new cursor
            # per execute and the context manager were a quarter of a settlement's CPU).
            cur = self._cursor
            cur.execute(_sql(name, self.schema), params)
        else:
            with self._bounded(lock_types, before) as conn:
                cur = conn.execute(_sql(name, self.schema), params)
        # Not `cur.description`: it builds a Column object per column on every call.
        result = cur.pgresult
        rows = cur.fetchall() if result is not None and result.nfields else []
        return cur.rowcount, rows

    def attempt_params(self, outcome: str) -> dict[str, Any]:
        """The parameters of sql `attempt_recorded`: the settled attempt's outcome and its
        worker (the pid read now: a repository built before a fork settles in the child)."""
        pid = self.pid if self.pid is not None else os.getpid()
        return {"outcome": outcome, "host": self.host, "pid": pid, "slot": self.slot}

    @property
    def has_read_lane(self) -> bool:
        return self.read is not self.write
