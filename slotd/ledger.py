"""A slot's ledger: the settlements it made and the lease it holds, in memory it shares with
its supervisor.

Why: the supervisor counts every settlement (metrics, the dashboard's outcomes) and must
know each slot's lease (to settle it at once if the slot dies, to route a cancel). A message
per task for that woke the supervisor once per task and cost both processes a pickle and a
pipe write: a third of slotd's CPU per no-op task. Now the slot writes each settlement into
a ring here, without a system call, and rings the supervisor's bell (a small message with
the ring's count and the current lease) at most every RING_HOLD seconds while busy, when the
ring is half full, and before it goes idle.

Nothing is lost or counted twice when a slot is killed: the supervisor consumes records in
order up to the count a bell named (everything before a bell's write(2) is visible to the
reader of that bell, whatever the CPU's memory order), and after the slot is dead it reads
the rest, and the lease, from the page itself. A record that does not fit (a task type
longer than TYPE_MAX bytes, a ring the supervisor has not drained) goes as a message.

Layout: written count (u64, the slot's), consumed count (u64, the supervisor's), the lease
(token, length, pickled fields: the token is cleared first and written last, so a slot
killed mid-write leaves no lease rather than half of one), then CAPACITY records."""

from __future__ import annotations

import math
import mmap
import pickle
import struct
import uuid
from datetime import UTC, datetime
from typing import Any

from slotd.outcome import Outcome
from slotd.repository import Claimed

CAPACITY = 1024
RECORD = struct.Struct("<ddBH")  # duration, delay (NaN: none), outcome, type length
RECORD_SIZE = 128
TYPE_MAX = RECORD_SIZE - RECORD.size
LEASE_MAX = 16 * 1024
_COUNTS = struct.Struct("<QQ")
_LEASE = _COUNTS.size
_LEASE_BODY = _LEASE + 20
_RING = _LEASE_BODY + LEASE_MAX
SIZE = _RING + CAPACITY * RECORD_SIZE
_NO_TOKEN = bytes(16)
OUTCOMES = tuple(str(o) for o in Outcome)

Settled = tuple[str, str, float | None, float | None]  # task type, outcome, duration, delay


def _float(value: float | None) -> float:
    return math.nan if value is None else value


def _maybe(value: float) -> float | None:
    return None if math.isnan(value) else value


class Ledger:
    """Made by the supervisor before it forks a slot; the fork shares the page."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, SIZE)  # anonymous and MAP_SHARED: the fork shares it
        self.count = 0  # the slot's own copy of the written count

    # the slot's side

    def record(self, settled: Settled) -> bool:
        """Write one settlement; False when it must go as a message instead."""
        task_type, outcome, duration, delay = settled
        name = task_type.encode()
        if len(name) > TYPE_MAX or outcome not in OUTCOMES:
            return False
        consumed = _COUNTS.unpack_from(self.page)[1]
        if self.count - consumed >= CAPACITY:  # the supervisor is behind: never overwrite
            return False
        at = _RING + (self.count % CAPACITY) * RECORD_SIZE
        code = OUTCOMES.index(outcome)
        RECORD.pack_into(self.page, at, _float(duration), _float(delay), code, len(name))
        self.page[at + RECORD.size : at + RECORD.size + len(name)] = name
        self.count += 1
        self.page[0:8] = self.count.to_bytes(8, "little")
        return True

    def hold(self, lease: Claimed | None) -> None:
        """The lease the slot holds now (None: none): read by the supervisor if it dies."""
        page = self.page
        page[_LEASE : _LEASE + 16] = _NO_TOKEN
        if lease is None:
            return
        body = pickle.dumps(lean(lease), pickle.HIGHEST_PROTOCOL)
        if len(body) > LEASE_MAX:  # a task type named in kilobytes: left to expire
            return
        page[_LEASE_BODY : _LEASE_BODY + len(body)] = body
        page[_LEASE + 16 : _LEASE + 20] = len(body).to_bytes(4, "little")
        page[_LEASE : _LEASE + 16] = lease.token.bytes

    def unread(self) -> int:
        return self.count - _COUNTS.unpack_from(self.page)[1]

    # the supervisor's side

    def consume(self, upto: int | None = None) -> list[Settled]:
        """The records written since the last call, up to the count a bell named (None:
        all there are, only once the slot is dead)."""
        if self.page.closed:
            return []
        written, consumed = _COUNTS.unpack_from(self.page)
        end = written if upto is None else min(upto, written)
        out: list[Settled] = []
        for n in range(max(consumed, end - CAPACITY), end):
            at = _RING + (n % CAPACITY) * RECORD_SIZE
            duration, delay, code, length = RECORD.unpack_from(self.page, at)
            name = self.page[at + RECORD.size : at + RECORD.size + length].decode()
            out.append((name, OUTCOMES[code], _maybe(duration), _maybe(delay)))
        if end > consumed:
            self.page[8:16] = end.to_bytes(8, "little")
        return out

    def lease(self) -> Claimed | None:
        """The lease the slot held when it died."""
        page = self.page
        if page.closed or page[_LEASE : _LEASE + 16] == _NO_TOKEN:
            return None
        length = int.from_bytes(page[_LEASE + 16 : _LEASE + 20], "little")
        try:
            fields = pickle.loads(page[_LEASE_BODY : _LEASE_BODY + length])
        except Exception:  # noqa: BLE001 - a torn lease is no lease
            return None
        return unlean(fields)

    def close(self) -> None:
        self.page.close()


def lean(lease: Claimed) -> tuple[Any, ...]:
    """What the supervisor needs of a lease, as plain values (cheap to pickle): not the
    payload or the key, which only the runner reads."""
    return (
        lease.id,
        lease.task_type,
        lease.run_at.timestamp(),
        lease.attempt,
        lease.max_attempts,
        lease.token.bytes,
        lease.lease_expires_at.timestamp(),
        lease.claimed_at.timestamp(),
    )


def unlean(fields: tuple[Any, ...] | None) -> Claimed | None:
    if fields is None:
        return None
    task_id, task_type, run_at, attempt, most, token, expires, claimed_at = fields

    def when(ts: float) -> datetime:
        return datetime.fromtimestamp(ts, UTC)

    return Claimed(
        task_id,
        task_type,
        {},
        None,
        when(run_at),
        attempt,
        most,
        uuid.UUID(bytes=token),
        when(expires),
        when(claimed_at),
    )
