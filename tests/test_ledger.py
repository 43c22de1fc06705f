"""A slot's ledger: the settlements and the lease it leaves in memory shared with its
supervisor (tests/test_chaos.py counts them through slot deaths on a real daemon)."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

from slotd.repository import Claimed
from slotd.slot.ledger import BATCH_AT, CAPACITY, DONE, TYPE_MAX, WAITING, Ledger, lean, unlean


def claimed(task_id: int, task_type: str = "email.send") -> Claimed:
    now = datetime.now(UTC).replace(microsecond=0)
    return Claimed(
        task_id, task_type, {"to": "x"}, "k", now, 2, 5, uuid.uuid4(), now + timedelta(60), now
    )


def test_the_supervisor_reads_up_to_each_bell_and_the_rest_after_the_slot_died() -> None:
    ledger = Ledger()
    lease = claimed(7)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the slot: three settlements, a bell after the first two, then killed
        ledger.record(("email.send", "success", 0.5, 0.01))
        ledger.record(("email.send", "failure", 1.5, None))
        os.write(write, ledger.count.to_bytes(8, "little"))
        ledger.record(("report.build", "timeout", None, 0.2))
        ledger.hold(lease)
        os.kill(os.getpid(), 9)
    bell = int.from_bytes(os.read(read, 8), "little")
    os.waitpid(pid, 0)
    assert ledger.consume(bell) == [
        ("email.send", "success", 0.5, 0.01),
        ("email.send", "failure", 1.5, None),
    ]
    assert ledger.consume(bell) == []  # consumed once
    assert ledger.consume(None) == [("report.build", "timeout", None, 0.2)]
    assert ledger.consume(None) == []
    held = ledger.lease()
    # What a settlement needs, without the payload or the key (only the runner reads those).
    assert held == Claimed(
        7, "email.send", {}, None, lease.run_at, 2, 5, lease.token,
        lease.lease_expires_at, lease.claimed_at,
    )  # fmt: skip
    assert unlean(lean(lease)) == held and unlean(None) is None


def test_no_lease_after_a_settlement_without_a_claim_or_a_torn_write() -> None:
    ledger = Ledger()
    ledger.hold(claimed(1))
    ledger.hold(None)
    assert ledger.lease() is None
    ledger.hold(claimed(2))
    ledger.page[16:32] = bytes(16)  # killed mid-write: the token is cleared first
    assert ledger.lease() is None
    ledger.close()
    assert ledger.lease() is None and ledger.consume(None) == []


def test_a_full_ring_or_a_long_type_name_goes_as_a_message_and_nothing_is_overwritten() -> None:
    ledger = Ledger()
    assert not ledger.record(("t" * (TYPE_MAX + 1), "success", None, None))
    assert not ledger.record(("t", "exploded", None, None))  # not an outcome slotd has
    for n in range(CAPACITY):
        assert ledger.record((f"t{n}", "success", float(n), None))
    assert ledger.unread() == CAPACITY
    assert not ledger.record(("late", "success", None, None))  # the supervisor is behind
    got = ledger.consume(None)
    assert [g[2] for g in got] == [float(n) for n in range(CAPACITY)]
    assert ledger.unread() == 0
    assert ledger.record(("after", "success", None, None))  # the ring wraps round
    assert ledger.consume(None) == [("after", "success", None, None)]


def test_a_batch_moves_through_its_states_in_place_and_a_killed_slot_leaves_each_one() -> None:
    # A batch's leases are pickled once, when they join the record; started, ran to success,
    # settled: each a byte written in place (#43 item 2). What a slot killed at any point
    # left is what the supervisor reads, state by state.
    ledger = Ledger()
    first = [claimed(i) for i in (1, 2, 3)]
    then = [claimed(i) for i in (4, 5)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the slot: a batch of 3, two run (one to success), then a second batch
        ledger.batch_put(first, WAITING)
        body = bytes(ledger.page[BATCH_AT + 16 : BATCH_AT + 20])
        for lease in first[:2]:  # started: the running lease, then out of the batch
            ledger.hold(lease)
            ledger.batch_drop([lease.token.bytes])
        ledger.batch_put([first[0]], DONE)  # ran to success, held for the batch's statement
        ledger.hold(first[1])
        unchanged = bytes(ledger.page[BATCH_AT + 16 : BATCH_AT + 20]) == body
        ledger.batch_put(then, WAITING)  # new claims: the record anew, without the gone
        os.write(write, bytes([unchanged]))
        os.kill(os.getpid(), 9)
    unchanged = os.read(read, 1) == b"\x01"
    os.waitpid(pid, 0)
    assert unchanged  # the states changed, the pickled leases were not written again
    left = {lease.id: state for lease, state in ledger.batch()}
    assert left == {1: DONE, 3: WAITING, 4: WAITING, 5: WAITING}
    held = ledger.lease()
    assert held is not None and held.id == 2  # the running one, out of the batch

    ledger.close()
    assert ledger.batch() == []

    ledger = Ledger()  # in one process: the slot's side
    ledger.batch_put(then, WAITING)
    ledger.batch_drop([lease.token.bytes for lease in then])
    assert ledger.batch() == []  # all settled or started: no record left
    ledger.batch_put(first, WAITING)
    assert [lease.id for lease, _ in ledger.batch()] == [1, 2, 3]
