"""What a producer runs: enqueue's one statement, its input validated before anything is
sent, on a sync or an asyncio connection or cursor (the caller's transaction)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slotd.config import priority_step
from slotd.payload import encode
from slotd.registry import validate_type_name
from slotd.repository.causes import PARENT_EXPIRED
from slotd.repository.named import AsyncExecutor, Executor, _sql, resolve_schema
from slotd.typed.ids import EnqueuedId


def _json_object(payload: Mapping[str, Any] | None, task_type: str) -> str:
    return encode(payload, f"task {task_type!r}")


def _seconds(delay: timedelta | float | int | None) -> float:
    if delay is None:
        return 0.0
    return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


PRIORITY_RANGE = range(-100, 101)
# The largest head start is this many steps: what bounds a scan in delivery order.
PRIORITY_SPAN = 100


UNIQUE_MODES = ("live", "pending")

# A tag: what slotd.tasks(tag=...) and the dashboard find a task by ("tenant:7").
TAG_MAX = 128
TAGS_MAX = 32


@dataclass(frozen=True)
class NewTask:
    task_type: str
    payload: Mapping[str, Any] | None = None
    delay: timedelta | float | None = None
    key: str | None = None
    priority: int = 0
    group: str | None = None
    # What a key dedupes against: "live" (a pending or running task) or "pending" (one
    # not started yet). None: the call's `unique=` (default "live").
    unique: str | None = None
    # Not started within this long of the enqueue: never starts, ends "expired". None: the
    # call's `expires_in=` (default: never).
    expires_in: timedelta | float | None = None
    # Due at this instant (an aware datetime), instead of `delay` after the enqueue.
    run_at: datetime | None = None
    # Labels to find it by (slotd.tasks(tag=...)): short strings.
    tags: Sequence[str] | None = None
    # The sequence it runs in (sql/080): one at a time, in the order of the enqueues'
    # commits. None: none.
    sequence: str | None = None
    # Debounce (with a key): one run this long after the key's last enqueue, with the last
    # payload ("first": the first), at most debounce_max after the burst's first enqueue.
    debounce: timedelta | float | None = None
    debounce_max: timedelta | float | None = None
    debounce_keep: str = "last"


def _run_at(row: NewTask) -> datetime | None:
    """An aware datetime, never with a delay: a naive one would be read in some server's
    time zone, an hour or more off."""
    value = row.run_at
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"task {row.task_type!r}: run_at must be a datetime, not {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"task {row.task_type!r}: run_at must be an aware datetime (with a tzinfo, e.g."
            " datetime.now(UTC)); a naive one has no single meaning"
        )
    if row.delay:
        raise ValueError(f"task {row.task_type!r}: give run_at or delay, not both")
    return value


def _tags(row: NewTask) -> str | None:
    """The tags as a JSON array (the statement's input), or None for none."""
    tags = row.tags
    if tags is None:
        return None
    if isinstance(tags, str) or not isinstance(tags, Sequence | set | frozenset):
        raise TypeError(f"task {row.task_type!r}: tags must be a list of strings, not {tags!r}")
    tags = sorted(set(tags)) if isinstance(tags, set | frozenset) else list(dict.fromkeys(tags))
    if len(tags) > TAGS_MAX:
        raise ValueError(f"task {row.task_type!r}: at most {TAGS_MAX} tags, got {len(tags)}")
    for tag in tags:
        if not isinstance(tag, str) or not tag or len(tag) > TAG_MAX or "\x00" in tag:
            raise ValueError(
                f"task {row.task_type!r}: tag {tag!r} must be a non-empty string of at most"
                f" {TAG_MAX} characters"
            )
    return json.dumps(tags) if tags else None


def _expires(value: object, row: NewTask, delay_s: float) -> float | None:
    """Seconds from the enqueue to the task's expiry, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise TypeError(f"task {row.task_type!r}: expires_in must be a timedelta or seconds")
    seconds = _seconds(value)
    if seconds <= 0:
        raise ValueError(f"task {row.task_type!r}: expires_in must be positive, got {value!r}")
    if seconds <= delay_s:
        # It would expire before it is due: it could never run.
        raise ValueError(
            f"task {row.task_type!r}: expires_in ({seconds:g}s) must be longer than the "
            f"delay ({delay_s:g}s), or the task could never start"
        )
    return seconds


def _unique(value: object, row: NewTask) -> bool:
    """True for unique="pending"."""
    if value not in UNIQUE_MODES:
        raise ValueError(
            f"task {row.task_type!r}: unique must be 'live' or 'pending', got {value!r}"
        )
    if value == "pending" and row.key is None:
        raise ValueError(f"task {row.task_type!r}: unique='pending' needs a key")
    return value == "pending"


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
    unique: str = "live",
    trace: str | None = None,
    expires_in: timedelta | float | None = None,
) -> dict[str, Any] | None:
    """The `enqueue` statement's parameters, or None for no items. The one place producer
    input is validated (the sync and asyncio paths share it): everything is checked before
    anything is sent, so bad input leaves the caller's transaction untouched. A task of
    priority p is ordered as if it had become due p x priority_step earlier (the
    producer's step, stamped on the row). `trace`: the producer's trace context as JSON
    (slotd.tracing), stored with every row; None stores nothing."""
    rows = [item if isinstance(item, NewTask) else NewTask(*item) for item in items]
    if not rows:
        return None
    step = priority_step.total_seconds()
    types, payloads, keys, delays, priorities, groups, leads = [], [], [], [], [], [], []
    pending, expires, run_ats, tags = [], [], [], []
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
        pending.append(_unique(unique if row.unique is None else row.unique, row))
        run_ats.append(_run_at(row))
        tags.append(_tags(row))
        own = row.expires_in if row.expires_in is not None else expires_in
        ahead = delays[-1] if run_ats[-1] is None else _until(run_ats[-1])
        expires.append(_expires(own, row, ahead))
    return {
        "types": types,
        "payloads": payloads,
        "keys": keys,
        "delays": delays,
        "priorities": priorities,
        "groups": groups,
        "leads": leads,
        "pending": pending,
        "expires": expires,
        "run_ats": run_ats,
        "tags": tags,
        "max_attempts": max_attempts,
        "explicit": explicit,
        "trace": trace,
    }


def _until(when: datetime) -> float:
    """Seconds from now to `when` on this host's clock: only for checking an expiry against
    the start time (the database's clock decides when it is due)."""
    return (when - datetime.now(when.tzinfo)).total_seconds()


def enqueue_many(
    target: Executor,
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int = 20,
    explicit: bool = False,
    priority_step: timedelta = timedelta(seconds=1),
    unique: str = "live",
    trace: str | None = None,
    schema: str | None = None,
    expires_in: timedelta | float | None = None,
) -> list[EnqueuedId]:
    """Insert tasks inside the caller's transaction and return their ids, in order; a key
    with a live row (unique="pending": a row not started yet) returns that row's id.
    `explicit=False`: the claiming worker stamps its own max_attempts over this one.
    `schema`: the queue's (None: SLOTD_SCHEMA, else public)."""
    schema = resolve_schema(schema)
    params = enqueue_params(
        items,
        max_attempts=max_attempts,
        explicit=explicit,
        priority_step=priority_step,
        unique=unique,
        trace=trace,
        expires_in=expires_in,
    )
    if params is None:
        return []
    result = target.execute(_sql("enqueue", schema), params).fetchall()
    ids: list[EnqueuedId] = []
    for index, (_ord, task_id, task_type, key, created) in enumerate(result):
        for _ in range(_KEY_TRIES):
            if task_id is not None:
                break
            # Met a concurrent or same-batch enqueue of the same key: a new statement sees
            # that row, unless it was claimed and finished meanwhile; then insert ours.
            by_key = {"task_type": task_type, "key": key}
            for look in _second_looks(params, index):
                row = target.execute(_sql(look, schema), by_key).fetchone()
                if row:
                    task_id, created = row[0], False
                    break
            else:
                # Nothing live holds the key: an expired task no sweep has ended may (it
                # stays in the dedupe index until its end). End it (its sequence's lock
                # first, as every end of a member takes it), then insert ours.
                target.execute(_sql("sequence_lock_key", schema), by_key)
                target.execute(_sql("expire_key", schema), _expire_key(by_key))
                task_id, created = _enqueue_one(target, params, index, schema)
        ids.append(_found(task_id, task_type, key, created))
    return ids


def _second_looks(params: dict[str, Any], index: int) -> tuple[str, ...]:
    """Where a key whose insert met another row is found: a unique="pending" row dedupes
    against a row not started (locked), else a running unique="live" one holding the key."""
    return ("pending_by_key", "live_by_key") if params["pending"][index] else ("live_by_key",)


def _enqueue_one(
    target: Executor, params: dict[str, Any], index: int, schema: str | None = None
) -> tuple[int | None, bool]:
    row = target.execute(_sql("enqueue", schema), _one(params, index)).fetchall()[0]
    return row[1], row[4]


async def enqueue_many_async(
    target: AsyncExecutor,
    items: Iterable[NewTask | tuple[Any, ...]],
    *,
    max_attempts: int = 20,
    explicit: bool = False,
    priority_step: timedelta = timedelta(seconds=1),
    unique: str = "live",
    trace: str | None = None,
    schema: str | None = None,
    expires_in: timedelta | float | None = None,
) -> list[EnqueuedId]:
    """enqueue_many on a psycopg AsyncConnection or AsyncCursor: the same statement."""
    schema = resolve_schema(schema)
    params = enqueue_params(
        items,
        max_attempts=max_attempts,
        explicit=explicit,
        priority_step=priority_step,
        unique=unique,
        trace=trace,
        expires_in=expires_in,
    )
    if params is None:
        return []
    result = await (await target.execute(_sql("enqueue", schema), params)).fetchall()
    ids: list[EnqueuedId] = []
    for index, (_ord, task_id, task_type, key, created) in enumerate(result):
        for _ in range(_KEY_TRIES):
            if task_id is not None:
                break
            by_key = {"task_type": task_type, "key": key}
            for look in _second_looks(params, index):
                found = await target.execute(_sql(look, schema), by_key)
                row = await found.fetchone()
                if row:
                    task_id, created = row[0], False
                    break
            else:
                await target.execute(_sql("sequence_lock_key", schema), by_key)
                await target.execute(_sql("expire_key", schema), _expire_key(by_key))
                again = await target.execute(_sql("enqueue", schema), _one(params, index))
                first = (await again.fetchall())[0]
                task_id, created = first[1], first[4]
        ids.append(_found(task_id, task_type, key, created))
    return ids


# A keyed row that keeps finishing between our two statements, this many times in a row,
# is not a race any more but a bug worth an error.
_KEY_TRIES = 5


def _expire_key(by_key: dict[str, Any]) -> dict[str, Any]:
    """`expire_key`'s parameters: the key, and how a dependant of the expired task is told."""
    return {**by_key, "cause": PARENT_EXPIRED, "step_s": priority_step().total_seconds()}


def _one(params: dict[str, Any], index: int) -> dict[str, Any]:
    """The enqueue parameters for input row `index` alone."""
    return {k: v[index : index + 1] if isinstance(v, list) else v for k, v in params.items()}


def _found(task_id: int | None, task_type: str, key: str | None, created: bool) -> EnqueuedId:
    if task_id is None:
        raise RuntimeError(f"task {task_type!r} key {key!r}: no live row and no insert")
    return EnqueuedId(task_id, bool(created))
