"""A slot's ledger: the settlements it made, the lease it holds and its last words (the
outcome of the attempt it is about to settle), in memory it shares with its supervisor.

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

Last words: the supervisor needs an attempt's outcome only when the slot dies between the
handler's end and its settlement (then a success is dequeued, never run again; see
slotd/supervisor/orphans.py), so the slot leaves it here before settling, without a message,
and the supervisor reads it only once the slot is dead.

A batch (#43, the rule book's "batched"): the leases a slot holds besides the running one,
in a record of their own: each prefetched task it claimed and has not started (WAITING),
and each plain success it ran and has not settled yet (DONE, its last words). A lease moves
between the records in an order that leaves it in the batch record whenever a kill could
find it in both (the batch's word wins: a WAITING task never reached its runner, a DONE one
ran to success), and the settlements of a batch go into the ring before the batch record
drops them, so `batch()` leaves out what the ring says was settled. The record's leases are
pickled once, when leases join it (a claim's batch); each one's state after that is one byte
written in place (`_BatchRecord`), not the whole batch pickled again: that was two pickles
of up to 40 leases per task, a tenth of a busy slot's CPU (#43 item 2).

Layout: written count (u64, the slot's), consumed count (u64, the supervisor's), the lease
record, the last-words record, the batch record (each a `_Record`: keyed by the lease
token, the batch's by BATCH_KEY), then CAPACITY settlement records."""

from __future__ import annotations

import math
import mmap
import pickle
import struct
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from slotd.outcome import Outcome, Result
from slotd.payload import RESULT_MAX
from slotd.repository import Claimed, storable

CAPACITY = 1024
# duration, delay (NaN: none), outcome, type length, the token of the lease it settled
RECORD = struct.Struct("<ddBH16s")
RECORD_SIZE = 128
TYPE_MAX = RECORD_SIZE - RECORD.size
LEASE_MAX = 16 * 1024
# Room for a stored result (bounded by RESULT_MAX) beside a cut traceback: the supervisor
# settles a dead slot's success by these words, value and all.
WORDS_MAX = RESULT_MAX + 64 * 1024
# A batch of leases (lean, state): room for slotd.slot.batching.MAX_BATCH of each state.
BATCH_MAX = 64 * 1024
# How many leases the batch record holds at most (its state bytes): a batch's claims
# (MAX_BATCH, 20) beside the held successes of the one before, with room to spare.
BATCH_SLOTS = 128
WAITING, DONE = "waiting", "done"
_GONE = 0
_STATE_CODE = {WAITING: 1, DONE: 2}
_STATE_NAME = {1: WAITING, 2: DONE}
BATCH_KEY = b"\x01" * 16
_COUNTS = struct.Struct("<QQ")
LEASE_AT = _COUNTS.size
WORDS_AT = LEASE_AT + LEASE_MAX
BATCH_AT = WORDS_AT + WORDS_MAX
_RING = BATCH_AT + BATCH_MAX
SIZE = _RING + CAPACITY * RECORD_SIZE
_NO_TOKEN = bytes(16)
OUTCOMES = tuple(str(o) for o in Outcome)

Settled = tuple[str, str, float | None, float | None]  # task type, outcome, duration, delay


def _float(value: float | None) -> float:
    return math.nan if value is None else value


def _maybe(value: float) -> float | None:
    return None if math.isnan(value) else value


class _Record:
    """A pickled value keyed by a lease token, at `at` on the page: token (16 bytes), length
    (4), body. The token is cleared first and written last, so a writer killed mid-write
    leaves no record rather than half of one, and a record about an earlier lease never
    matches a later lease's token."""

    def __init__(self, page: mmap.mmap, at: int, size: int) -> None:
        self.page, self.at, self.size = page, at, size

    def put(self, token: bytes, value: Any) -> bool:
        """False (and no record) when the value does not fit."""
        body = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        page, at = self.page, self.at
        page[at : at + 16] = _NO_TOKEN
        if len(body) > self.size - 20:
            return False
        page[at + 20 : at + 20 + len(body)] = body
        page[at + 16 : at + 20] = len(body).to_bytes(4, "little")
        page[at : at + 16] = token
        return True

    def clear(self) -> None:
        self.page[self.at : self.at + 16] = _NO_TOKEN

    def get(self, token: bytes | None = None) -> Any:
        """The value under `token` (None: under whatever token is there), else None."""
        page, at = self.page, self.at
        if page.closed:
            return None
        held = page[at : at + 16]
        if held == _NO_TOKEN or (token is not None and held != token):
            return None
        length = int.from_bytes(page[at + 16 : at + 20], "little")
        try:
            return pickle.loads(page[at + 20 : at + 20 + length])
        except Exception:  # noqa: BLE001 - a torn record is no record
            return None


class _BatchRecord:
    """The batch's leases, at `at` on the page: token (16 bytes, BATCH_KEY when set),
    length (4), BATCH_SLOTS state bytes (one per lease, by its place in the list), then the
    pickled list of leases. `put` writes the whole record, token cleared first and written
    last (as `_Record`); `mark` changes one lease's state with a one-byte write, which a kill
    cannot tear. The slot keeps its own copy (which lease is where, each one's state)."""

    def __init__(self, page: mmap.mmap, at: int, size: int) -> None:
        self.page, self.at, self.size = page, at, size
        self.leases: list[tuple[Any, ...]] = []  # lean, in the record's order
        self.states = bytearray(BATCH_SLOTS)
        self.place: dict[bytes, int] = {}  # token -> its place in `leases`

    def put(self, leases: list[tuple[Any, ...]], states: bytes) -> None:
        """The whole record anew: these leases, each in its state."""
        body = pickle.dumps(leases, pickle.HIGHEST_PROTOCOL)
        page, at = self.page, self.at
        page[at : at + 16] = _NO_TOKEN
        if len(leases) > BATCH_SLOTS or len(body) > self.size - 20 - BATCH_SLOTS:
            raise RuntimeError("a batch larger than the ledger's batch record")
        start = at + 20 + BATCH_SLOTS
        page[start : start + len(body)] = body
        page[at + 16 : at + 20] = len(body).to_bytes(4, "little")
        self.states = bytearray(states.ljust(BATCH_SLOTS, b"\0"))
        page[at + 20 : at + 20 + BATCH_SLOTS] = self.states
        page[at : at + 16] = BATCH_KEY
        self.leases = leases
        self.place = {fields[5]: n for n, fields in enumerate(leases)}

    def mark(self, place: int, state: int) -> None:
        self.states[place] = state
        self.page[self.at + 20 + place] = state

    def clear(self) -> None:
        self.page[self.at : self.at + 16] = _NO_TOKEN
        self.leases, self.place = [], {}
        self.states = bytearray(BATCH_SLOTS)

    def read(self) -> list[tuple[tuple[Any, ...], int]]:
        """The supervisor's read, once the slot is dead: (lease, state code) of each lease
        not gone; nothing when the record is unset or torn."""
        page, at = self.page, self.at
        if page.closed or page[at : at + 16] != BATCH_KEY:
            return []
        length = int.from_bytes(page[at + 16 : at + 20], "little")
        states = page[at + 20 : at + 20 + BATCH_SLOTS]
        start = at + 20 + BATCH_SLOTS
        try:
            leases = pickle.loads(page[start : start + length])
        except Exception:  # noqa: BLE001 - a torn record is no record
            return []
        return [(fields, states[n]) for n, fields in enumerate(leases) if states[n] != _GONE]


class Ledger:
    """Made by the supervisor before it forks a slot; the fork shares the page."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, SIZE)  # anonymous and MAP_SHARED: the fork shares it
        self.count = 0  # the slot's own copy of the written count
        self._lease = _Record(self.page, LEASE_AT, LEASE_MAX)
        self._words = _Record(self.page, WORDS_AT, WORDS_MAX)
        self._batch = _BatchRecord(self.page, BATCH_AT, BATCH_MAX)

    # the slot's side

    def settled(
        self,
        settled: Settled,
        token: uuid.UUID,
        then: Claimed | None,
        between: Callable[[], None] | None = None,
    ) -> bool:
        """A settlement of the lease under `token`, and the lease held after it (the claim
        that rode on it, or none): one step. The record goes first and names the token it
        settled, so a slot killed between the two writes leaves a lease that `lease()`
        knows was settled: it is neither settled again (a second count) nor lost. False
        when the record must go as a message instead."""
        written = self.record(settled, token.bytes)
        if between is not None:
            between()  # a chaos run's kill point
        self.hold(then)
        return written

    def record(self, settled: Settled, token: bytes = _NO_TOKEN) -> bool:
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
        RECORD.pack_into(self.page, at, _float(duration), _float(delay), code, len(name), token)
        self.page[at + RECORD.size : at + RECORD.size + len(name)] = name
        self.count += 1
        self.page[0:8] = self.count.to_bytes(8, "little")
        return True

    def hold(self, lease: Claimed | None) -> None:
        """The lease the slot holds now (None: none): read by the supervisor if it dies. A
        task type named in kilobytes does not fit: that lease is left to expire."""
        if lease is None:
            self._lease.clear()
            return
        token = lease.token.bytes
        place = self._batch.place.get(token)  # a batched lease's was made when it joined
        fields = lean(lease) if place is None else self._batch.leases[place]
        self._lease.put(token, fields)

    def say(self, token: uuid.UUID, result: Result) -> None:
        """Last words: the outcome of the attempt leased under `token`, before settling it."""
        if not self._words.put(token.bytes, result.fields()):
            # A huge traceback: its head and tail are enough.
            cut = replace(result, error=storable(result.error or "", 4000))
            self._words.put(token.bytes, cut.fields())

    def batch_put(self, leases: list[Claimed], state: str) -> None:
        """These leases into the batch record, as `state` (WAITING: claimed, not started;
        DONE: ran to success, not settled). A lease already in the record (a prefetched task
        that ran) changes state in place; new ones rewrite the record, without those gone."""
        record, code = self._batch, _STATE_CODE[state]
        new = [lease for lease in leases if lease.token.bytes not in record.place]
        if new:
            kept = [n for n, fields in enumerate(record.leases) if record.states[n] != _GONE]
            entries = [record.leases[n] for n in kept] + [lean(lease) for lease in new]
            states = bytes(record.states[n] for n in kept) + bytes([code]) * len(new)
            record.put(entries, states)
        for lease in leases:
            place = record.place[lease.token.bytes]
            if record.states[place] != code:
                record.mark(place, code)

    def batch_drop(self, tokens: list[bytes]) -> None:
        """Leases that left the batch: started (after `hold`), or settled (after their
        records went into the ring)."""
        record = self._batch
        for token in tokens:
            place = record.place.get(token)
            if place is not None and record.states[place] != _GONE:
                record.mark(place, _GONE)
        if record.leases and not any(record.states):
            record.clear()

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
            duration, delay, code, length, _ = RECORD.unpack_from(self.page, at)
            name = self.page[at + RECORD.size : at + RECORD.size + length].decode()
            out.append((name, OUTCOMES[code], _maybe(duration), _maybe(delay)))
        if end > consumed:
            self.page[8:16] = end.to_bytes(8, "little")
        return out

    def lease(self) -> Claimed | None:
        """The lease the slot held when it died; None when its last record settled it (a
        kill between the two writes of `settled`)."""
        lease = unlean(self._lease.get())
        if lease is None or self.page.closed:
            return lease
        written = _COUNTS.unpack_from(self.page)[0]
        if written:
            at = _RING + ((written - 1) % CAPACITY) * RECORD_SIZE
            if RECORD.unpack_from(self.page, at)[4] == lease.token.bytes:
                return None
        return lease

    def batch(self) -> list[tuple[Claimed, str]]:
        """The leases the slot held in its batch when it died, with their state, less those
        the ring's last records say were settled (a kill between the two writes of a
        batch's settlement)."""
        entries = self._batch.read()
        if not entries or self.page.closed:
            return []
        written = _COUNTS.unpack_from(self.page)[0]
        recent = set()
        for n in range(max(0, written - 2 * len(entries)), written):
            at = _RING + (n % CAPACITY) * RECORD_SIZE
            recent.add(RECORD.unpack_from(self.page, at)[4])
        out = []
        for fields, code in entries:
            lease = unlean(fields)
            if lease is not None and lease.token.bytes not in recent:
                out.append((lease, _STATE_NAME.get(code, WAITING)))
        return out

    def heard(self, token: uuid.UUID) -> Result | None:
        """The slot's last words about this lease, after it died; None if it said none."""
        fields = self._words.get(token.bytes)
        try:
            return None if fields is None else Result(*fields)
        except TypeError:  # not a Result's fields: torn, so no words
            return None

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
