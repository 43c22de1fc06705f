"""The queue protocol on a worker's lanes: discovery, the single-row claim, and the
settlements, every one fenced on the lease token (see the seed's design)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slotd.errors import LeaseLost
from slotd.payload import encode
from slotd.registry import Rate, Registry, SharedRow
from slotd.repository import composed
from slotd.repository.causes import PARENT_EXPIRED, PARENT_FAILED
from slotd.repository.lanes import Lanes
from slotd.repository.named import SHARED_SUFFIX, _sql
from slotd.repository.producing import PRIORITY_SPAN
from slotd.task import Task

# The reason a dependant's cancel gives when a parent's attempts ran out (format(): %s is
# the parent's id, or the ancestor's whose end doomed it).


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
    # The producer's trace context (sql/009), None when it enqueued outside a span.
    trace_context: dict[str, str] | None = None
    # Marked by a dependant's enqueue: settled by the parent's statements.
    has_dependants: bool = False
    # A dependant's: {parent id (as text, from jsonb): value}; None for every other task.
    parent_results: dict[str, Any] | None = None
    # The batch it belongs to (slotd.batch): its end is counted there.
    batch_id: int | None = None
    # Its durable steps stored so far (sql/070): [{"name", "value", "at"}] in the order they
    # ran, None when it took none. The attempt replays them (slotd.task.Context.step).
    steps: list[dict[str, Any]] | None = None
    # The lease this claim took over, when one had lapsed on the row (fragment lapsed_lease):
    # when it lapsed and when its attempt started; None for every other claim.
    lapsed_at: datetime | None = None
    lapsed_started: datetime | None = None

    @property
    def linked(self) -> bool:
        """Settled by the linked statements (dependants, a batch), not the plain ones."""
        return self.has_dependants or self.batch_id is not None

    @property
    def final_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def task(self) -> Task:
        parents = {int(k): v for k, v in (self.parent_results or {}).items()}
        return Task(
            self.id,
            self.task_type,
            self.payload,
            self.attempt,
            self.key,
            self.run_at,
            trace_context=self.trace_context,
            parent_results=parents,
        )

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


Limits = Mapping[str, tuple[int | None, int | None]]
Rates = Mapping[str, tuple[Rate | None, Rate | None]]


@dataclass(frozen=True)
class ClaimShape:
    """What every claim of one registry sends and decides by (see QueueProtocol._shape)."""

    registry: Registry
    types: list[str]
    literals: dict[str, Any]
    locked: list[str]  # limited or rated: these take the limit lock
    rated: frozenset[str]
    # The claim-lock keys of the shared limits each type is under ('@name', Registry.limit).
    shared_keys: dict[str, list[str]]
    # The fair types (fair=True): their claims stamp their group's turn (claim part `fair`).
    fair: frozenset[str]
    # Some type's groups may burst above their cap (Registry.group_bursts): its claims run
    # the `_shared` twins, which carry group_burst_closed.
    bursts: bool = False


def limit_params(
    limits: Limits,
    rates: Rates | None = None,
    shared: Sequence[SharedRow] = (),
    bursts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The within_limits and within_rates predicates' parallel arrays (within_shared's:
    one entry per type and shared limit it is under); empty for an unlimited registry.
    `bursts`: Registry.group_bursts (0 for a type not in it)."""
    names = sorted(limits)
    rated = sorted(rates or {})

    def count(rate: Rate | None) -> int | None:
        return None if rate is None else rate[0]

    def seconds(rate: Rate | None) -> float | None:
        return None if rate is None else rate[1].total_seconds()

    per_type = [(rates or {})[n] for n in rated]
    return {
        "limited": names,
        "max_running": [limits[n][0] for n in names],
        "max_per_group": [limits[n][1] for n in names],
        "group_burst": [(bursts or {}).get(n, 0) for n in names],
        "settling": None,
        "settling_token": None,
        "rated": rated,
        "rate_n": [count(r) for r, _ in per_type],
        "rate_s": [seconds(r) for r, _ in per_type],
        "group_rate_n": [count(g) for _, g in per_type],
        "group_rate_s": [seconds(g) for _, g in per_type],
        "shared_types": [r[0] for r in shared],
        "shared_names": [r[1] for r in shared],
        "shared_max": [r[2] for r in shared],
        "shared_max_group": [r[3] for r in shared],
        "shared_rate_n": [r[4] for r in shared],
        "shared_rate_s": [r[5] for r in shared],
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


# How many of a fair type's next claimable rows discover_fair ranks by turn (#39): a group's
# task further back than this waits until it comes within it.
FAIR_WINDOW = 1000


def _sequence_lock(task_id: int) -> tuple[str, dict[str, Any]]:
    """The statement a settlement that may end a sequence's member runs first (sql
    `sequence_lock_task`, sql/080): its snapshot then sees every member enqueued before."""
    return ("sequence_lock_task", {"id": task_id})


class QueueProtocol(Lanes):
    """Discovery, claim and the fenced settlements of one worker."""

    # discovery and claim

    def discover(
        self,
        types: Sequence[str],
        limit: int = 20,
        limits: Limits | None = None,
        on_primary: bool = False,
        rates: Rates | None = None,
        shared: Sequence[SharedRow] = (),
        fair: Sequence[str] = (),
        bursts: Mapping[str, int] | None = None,
    ) -> list[int]:
        """Candidate ids in delivery order (ordering key, then id), passing over rows that
        their type's or group's limit or rate holds back right now; from the read lane, or
        from the primary after a read-lane discovery whose candidates were all gone there.
        Then `wake_in_s`: the seconds until a served type has room again in its full rate
        window or its next row not yet due is due, whichever is first (None: neither);
        `sweep_in_s`: the seconds until the soonest unleased task's expires_at, negative
        when past (None: no task expires)."""
        params = {
            "types": list(types),
            "limit": limit,
            "lead_s": self.lead_s,
            **limit_params(limits or {}, rates, shared, bursts),
        }
        name = "discover"
        if fair:  # some served types take turns by group (sql `discover_fair`)
            name = "discover_fair"
            params.update(fair=list(fair), fair_window=FAIR_WINDOW)
        if shared or bursts:  # the twin carrying shared limits and bursts (repository/named.py)
            name += SHARED_SUFFIX
        conn = self.write if on_primary else self.read
        rows = conn.execute(_sql(name, self.schema), params).fetchall()
        waits = [wait for task_id, kind, wait in rows if task_id is None and kind is not None]
        self.wake_in_s = min(waits) if waits else None
        sweeps = [wait for task_id, kind, wait in rows if task_id is None and kind is None]
        self.sweep_in_s = sweeps[0] if sweeps else None
        found = [(task_id, task_type) for task_id, task_type, _ in rows if task_id is not None]
        self._candidate_types = dict(found)
        return [task_id for task_id, _ in found]

    def _shape(self, registry: Registry) -> ClaimShape:
        # Arrays go as array literals (text the statement casts): psycopg's list adaptation
        # walks every element in Python on every claim, 74 us per claim against 12 us for
        # these strings (tests/bench/cpu_per_task.py). The registry's arrays, and which of
        # its types take the limit lock or have a rate, change only when a type is
        # registered, so they are built once per registry and type list.
        types = registry.types
        cached = self._claim_arrays
        if cached is None or cached.registry is not registry or cached.types != types:
            shared = registry.shared_rows
            arrays = {
                "types": types,
                "ceilings_s": registry.ceilings_seconds,
                "max_attempts": registry.max_attempts(self.max_attempts),
                **limit_params(
                    registry.concurrency_limits, registry.rates, shared, registry.group_bursts
                ),
                "fair": registry.fair_types,
            }
            literals = {k: v if v is None else array_literal(v) for k, v in arrays.items()}
            keys: dict[str, list[str]] = {}
            for task_type, name, *_ in shared:
                keys.setdefault(task_type, []).append("@" + name)
            shared_rated = {r[0] for r in shared if r[4] is not None}
            cached = self._claim_arrays = ClaimShape(
                registry,
                types,
                literals,
                registry.claim_locked,
                frozenset(registry.rates) | shared_rated,
                keys,
                frozenset(registry.fair_types),
                bool(registry.group_bursts),
            )
        return cached

    def _claim_params(self, ids: Sequence[int], registry: Registry) -> dict[str, Any]:
        return {
            "ids": id_array(ids),
            **self._shape(registry).literals,
            "margin_s": self.lease_margin.total_seconds(),
            "lease_token": None,  # drawn by the server
        }

    def _lock_types(self, ids: Sequence[int], registry: Registry) -> list[str]:
        """The limited or rated types this claim may pick: those among the candidates when
        the last discovery found them all, else (ids from elsewhere) every such type served."""
        shape = self._shape(registry)
        limited = shape.locked
        if not limited:
            return []
        known = self._candidate_types
        if all(task_id in known for task_id in ids):
            chosen = {known[i] for i in ids} & set(limited)
        else:
            chosen = set(limited)
        # A shared limit's lock ('@name') too, in one sorted order with the types' locks.
        return sorted(chosen.union(*(shape.shared_keys.get(t, ()) for t in chosen)))

    def _claim_part(self, ids: Sequence[int], lock_types: Sequence[str], registry: Registry) -> str:
        """The claim part (slotd.repository.composed): `rated` when a candidate may be of a
        rated type, else `plain`: only the rated one names the rate tables (see claim_ctes
        in sql/queries.sql); each with its `fair` twin when a candidate may be of a fair
        type."""
        rated = self._shape(registry).rated
        part = "rated" if rated and not rated.isdisjoint(lock_types) else "plain"
        return self._fair_part(part, ids, registry)

    def _fair_part(self, part: str, ids: Sequence[int], registry: Registry) -> str:
        """`part`, or its fair twin when the claim may pick a fair type's row: its group's
        turn is stamped by the claim's own statement (claim_ctes_fair)."""
        if not self._fair(ids, registry):
            return part
        return "fair_rated" if part == "rated" else "fair"

    def _shared(self, name: str, registry: Registry) -> str:
        """A registry with shared limits runs each claim's twin that carries them."""
        shape = self._shape(registry)
        return name + SHARED_SUFFIX if shape.shared_keys or shape.bursts else name

    def claim(
        self, ids: Sequence[int], registry: Registry, lease_token: str | None = None
    ) -> Claimed | None:
        """`lease_token`: the new lease's token (a uuid's text), when the caller must be able
        to find its claim again (see held_lease); None: drawn by the server."""
        if not ids:
            return None
        lock = self._lock_types(ids, registry)
        part = self._claim_part(ids, lock, registry)
        name = self._shared(composed.claimed(part), registry)
        params = {**self._claim_params(ids, registry), "lease_token": lease_token}
        _, rows = self._write(name, params, lock)
        return self.remember_lapse(Claimed(*rows[0])) if rows else None

    def remember_lapse(self, claimed: Claimed) -> Claimed:
        """The attempt whose lapsed lease `claimed` took over, remembered (sql
        `lapse_remembered`; slotd/lifecycle/, "lapsed"); a claim of a row nobody held
        costs nothing here. Returns `claimed`."""
        if claimed.lapsed_at is not None:
            params = {
                "id": claimed.id,
                "token": claimed.token,
                "lapsed_at": claimed.lapsed_at,
                "started_at": claimed.lapsed_started,
            }
            self._write("lapse_remembered", params)
        return claimed

    def _fair(self, ids: Sequence[int], registry: Registry) -> bool:
        """Whether this claim may pick a fair type's row (its turn is stamped then): one
        among the candidates when the last discovery found them all, else any served."""
        fair = self._shape(registry).fair
        if not fair:
            return False
        known = self._candidate_types
        if all(task_id in known for task_id in ids):
            return any(known[i] in fair for i in ids)
        return True

    # fenced settlements

    def dequeue(
        self, task_id: int, token: uuid.UUID | None, kept: tuple[str | None, float] | None = None
    ) -> None:
        """`kept`: (the return value's JSON text, seconds to keep it), for a type with
        keep_result: stored by the same fenced statement."""
        params: dict[str, Any] = {"id": task_id, "done_token": token}
        if kept is None:  # the lone delete: answered by its row count
            count, _ = self._write(composed.succeeded("plain"), params)
        else:
            params.update(self.attempt_params("success"), value=kept[0], keep_s=kept[1])
            _, rows = self._write(composed.succeeded("kept"), params)
            count = rows[0][0]
        if count == 0:
            raise LeaseLost(f"task {task_id}: dequeue refused, the lease is not ours")

    def dequeue_and_claim(
        self,
        task_id: int,
        token: uuid.UUID | None,
        ids: Sequence[int],
        registry: Registry,
        lease_token: str | None = None,
        kept: tuple[str | None, float] | None = None,
        linked: tuple[str | None, float | None, bool] | None = None,
        member: bool = False,
    ) -> Claimed | None:
        """Dequeue a finished task and claim the next of `ids` in one statement: one round
        trip, one commit. A refused dequeue raises LeaseLost carrying the new claim.
        `lease_token`: the new lease's token, when the caller must be able to find its claim
        again (see held_lease). `kept`: as for dequeue. `linked`: (value, keep_s) of a task
        with dependants or of a batch, settled by `dequeue_linked_claim`; `member`: it is a
        batch's member claimed without dependants or a kept result, settled by the lighter
        `dequeue_member_claim`."""
        params = {
            **self._claim_params(ids, registry),
            "lease_token": lease_token,  # a uuid's text, or None: drawn by the server
            "id": task_id,
            "done_token": token,
            # The settled row's place is free for the claim riding on its settlement.
            "settling": task_id,
            "settling_token": token,
        }
        part = "plain"
        if linked is not None and member:
            part = "member"
        elif linked is not None:
            part = "linked"
            params.update(self._linked_params(*linked))
        elif kept is not None:
            part = "kept"
            params["value"], params["keep_s"] = kept
            params.update(self.attempt_params("success"))
        lock = self._lock_types(ids, registry)
        claim = self._claim_part(ids, lock, registry)
        name = self._shared(composed.succeeded(part, claim), registry)
        before = _sequence_lock(task_id) if part == "linked" else None
        _, rows = self._write(name, params, lock, before)
        dequeued, *claim = rows[0]
        claimed = self.remember_lapse(Claimed(*claim)) if claim[0] is not None else None
        if not dequeued and part == "member" and linked is not None:
            # Refused: the member gained dependants since its claim, or the lease is gone.
            # The linked statement settles the first and refuses the second; the claim that
            # rode on this statement stands either way (no second claim).
            try:
                self.dequeue_linked(task_id, token, *linked)
            except LeaseLost:
                raise LeaseLost(f"task {task_id}: dequeue refused", claimed) from None
            return claimed
        if not dequeued:
            raise LeaseLost(f"task {task_id}: dequeue refused, the lease is not ours", claimed)
        return claimed

    def _linked_params(
        self, value: str | None, keep_s: float | None, value_kept: bool = True
    ) -> dict[str, Any]:
        """`value_kept`: False for a type that keeps its history only (keep_history, no
        keep_result): the value reaches its dependants, its stored result has none."""
        return {
            "value": value if value is not None else "null",
            "kept_value": (value if value is not None else "null") if value_kept else None,
            "keep_s": keep_s,
            "step_s": self.lead_s / PRIORITY_SPAN,
            **self.attempt_params("success"),
        }

    def dequeue_linked(
        self,
        task_id: int,
        token: uuid.UUID | None,
        value: str | None,
        keep_s: float | None,
        value_kept: bool = True,
    ) -> None:
        """The success of a task with dependants, of a batch or of a sequence (sql
        `settled_linked`); LeaseLost when the lease is not ours."""
        params = {
            "id": task_id,
            "done_token": token,
            **self._linked_params(value, keep_s, value_kept),
        }
        name = composed.succeeded("linked")
        _, rows = self._write(name, params, before=_sequence_lock(task_id))
        if not rows[0][0]:
            raise LeaseLost(f"task {task_id}: dequeue refused, the lease is not ours")

    def record_failure(
        self,
        task_id: int,
        token: uuid.UUID,
        error: str,
        *,
        backoff_base: timedelta | None = None,
        backoff_cap: timedelta | None = None,
        linked: bool = False,
        discard: bool = False,
        jitter: float | None = None,
        outcome: str = "failure",
        sequence_go_on: bool = False,
    ) -> Failure:
        """Back off and keep the error. `backoff_base` / `backoff_cap`: the type's own,
        else the worker's. `linked`: a task with dependants or of a batch
        (record_failure_linked: its dead letter cancels its dependants, transitively, and
        is counted in its batch). `discard`: the dead letter now (reason 'discarded').
        `sequence_go_on`: its handler's sequence_on_failure="continue": a dead letter of a
        sequence's member makes the next member due instead of halting the sequence."""
        params = {
            "id": task_id,
            "token": token,
            "error": storable(error),
            "discard": discard,
            **self._backoff,
            **self.attempt_params(outcome),
        }
        if linked:
            params["cause"] = PARENT_FAILED
            params["sequence_go_on"] = sequence_go_on
            params["step_s"] = self.lead_s / PRIORITY_SPAN
        if backoff_base is not None:
            params["base_s"] = backoff_base.total_seconds()
        if backoff_cap is not None:
            params["cap_s"] = backoff_cap.total_seconds()
        if jitter is not None:  # a delay the handler chose (RetryAfter): taken exactly
            params["jitter"] = jitter
        if linked:
            name, before = composed.failed("linked"), _sequence_lock(task_id)
            _, rows = self._write(name, params, before=before)
        else:
            _, rows = self._write(composed.failed("plain"), params)
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

    def record_step(
        self, task_id: int, token: uuid.UUID, index: int, name: str, value: str
    ) -> bool:
        """Store a durable step's JSON `value` at place `index` of the task's steps, fenced
        on the lease; False when the lease is not ours (or the task was cancelled)."""
        params = {"id": task_id, "token": token, "index": index, "name": name, "value": value}
        count, _ = self._write("record_step", params)
        return count == 1

    def wait_step(
        self,
        task_id: int,
        token: uuid.UUID,
        index: int,
        name: str,
        event: str | None,
        for_s: float | None,
    ) -> tuple[str, Any] | None:
        """A durable sleep or event wait at place `index` (sql `wait_step`): (verdict, the
        event's data) with verdict "event", "due" or "suspend"; None when the lease is
        not ours, the task was cancelled or its steps are not the ones this run replayed."""
        params = {
            "id": task_id,
            "token": token,
            "index": index,
            "name": name,
            "event": event,
            "for_s": for_s,
        }
        before = ("event_lock", {"event": event}) if event is not None else None
        _, rows = self._write("wait_step", params, before=before)
        return (str(rows[0][0]), rows[0][1]) if rows else None

    def prune_turns_batch(self, retention_s: float, batch: int = 1000) -> int:
        """Up to `batch` fair types' group turns older than the retention (`turns_prune`)."""
        count, _ = self._write("turns_prune", {"retention_s": retention_s, "batch": batch})
        return count

    def prune_events_batch(self, retention_s: float, batch: int = 1000) -> int:
        """Up to `batch` emits older than the retention (sql `events_prune`)."""
        count, _ = self._write("events_prune", {"retention_s": retention_s, "batch": batch})
        return count

    def snooze(
        self, task_id: int, token: uuid.UUID, delay_s: float, max_snoozes: int
    ) -> tuple[int, bool] | None:
        """A handler's Snooze (sql `snooze`): None when the lease is not ours or the task
        was cancelled, else (its snoozes before this one, whether it snoozed: False past
        `max_snoozes`, and nothing was written)."""
        params = {"id": task_id, "token": token, "delay_s": delay_s, "max_snoozes": max_snoozes}
        _, rows = self._write("snooze", params)
        return (int(rows[0][0]), bool(rows[0][1])) if rows else None

    def held_lease(self, token: str) -> Claimed | None:
        """The live lease under `token` (a chained claim's, after its answer was lost)."""
        row = self.write.execute(_sql("held_lease", self.schema), {"token": token}).fetchone()
        return Claimed(*row) if row else None

    def lease_remains(self, task_id: int, token: uuid.UUID) -> bool | None:
        """Whether the row still carries this lease (True), another or none (False), or is
        gone (None): what a retried settlement asks about its first try."""
        row = self.write.execute(_sql("lease_of", self.schema), {"id": task_id}).fetchone()
        return None if row is None else row[0] == token

    def continue_slice(self, task_id: int, token: uuid.UUID) -> bool:
        """Release an advanced slice's row, due at once; False when the lease is not ours."""
        _, rows = self._write("continue_slice", {"id": task_id, "token": token})
        return len(rows) == 1

    def release(
        self,
        task_id: int,
        token: uuid.UUID,
        reason: str,
        *,
        refund_final: bool = False,
        unstarted: bool = False,
        outcome: str = "cancelled",
        sequence_go_on: bool = False,
    ) -> bool | None:
        """Give the lease back; None when it is not ours, else whether the row is now a dead
        letter. `refund_final`: a shutdown's release, which gives a final attempt back once
        per task (see the statement)."""
        params = {
            "id": task_id,
            "token": token,
            "reason": storable(reason),
            "refund_final": refund_final,
            "unstarted": unstarted,
            "cause": PARENT_FAILED,
            "sequence_go_on": sequence_go_on,
            "step_s": self.lead_s / PRIORITY_SPAN,
            **self.attempt_params(outcome),
        }
        _, rows = self._write("release", params, before=_sequence_lock(task_id))
        return bool(rows[0][1]) if rows else None

    def settle_cancelled(self, task_id: int, token: uuid.UUID) -> bool:
        params = {
            "id": task_id,
            "token": token,
            "step_s": self.lead_s / PRIORITY_SPAN,
            **self.attempt_params("cancelled"),
        }
        count, _ = self._write("settle_cancelled", params, before=_sequence_lock(task_id))
        return count == 1

    def expire_batch(self, batch: int = 1000) -> dict[str, int]:
        """Up to `batch` tasks past their expires_at that no lease holds, made dead letters
        with reason 'expired' (slotd.lifecycle.expire); how many of each type."""
        params = {"batch": batch, "cause": PARENT_EXPIRED, "step_s": self.lead_s / PRIORITY_SPAN}
        _, rows = self._write("expire", params, before=("sequence_lock_expiring", {}))
        return {task_type: int(n) for task_type, n in rows}

    def lapsed_batch(
        self, batch: int = 1000, go_on: Sequence[str] = ()
    ) -> dict[tuple[str, str], int]:
        """Up to `batch` final attempts whose lease lapsed with nobody to settle them, given
        the end their settlement would have written (slotd.lifecycle.sweep); how many of
        each (type, dead_reason). `go_on`: the types whose sequence goes on past a failed
        member (Registry.sequences_go_on); any other type's halts it."""
        params = {
            "batch": batch,
            "cause": PARENT_FAILED,
            "step_s": self.lead_s / PRIORITY_SPAN,
            "go_on": list(go_on),
        }
        _, rows = self._write("lapsed", params, before=("sequence_lock_lapsed", {}))
        return {(task_type, reason): int(n) for task_type, reason, n in rows}

    def cancel_reason(self, task_id: int, token: uuid.UUID) -> str | None:
        """The cancel's reason when an operator cancelled this lease's task, else None. On
        the write lane: a replica's lag must not hide a cancel."""
        row = self.write.execute(
            _sql("cancelled_lease", self.schema), {"id": task_id, "token": token}
        )
        found = row.fetchone()
        return str(found[0]) if found else None
