"""The watchdog's timeline, on a fake monotonic clock: what is due when."""

from datetime import UTC, datetime, timedelta

from slotd.slot.watchdog import Step, Watchdog


def dog(now: float = 100.0) -> Watchdog:
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    return Watchdog.for_deadline(deadline, timedelta(seconds=5), timedelta(seconds=25), now=now)


def test_interrupt_at_the_deadline_then_kill_after_the_kill_grace() -> None:
    d = dog()
    assert d.step(100.0) is None
    assert 9.9 <= d.interrupt_at - 100.0 <= 10.0
    assert d.step(d.interrupt_at) is Step.INTERRUPT
    assert d.step(d.interrupt_at + 1) is None  # interrupted once, not again
    assert d.step(d.interrupt_at + 4.99) is None
    assert d.step(d.interrupt_at + 5) is Step.KILL


def test_shutdown_cancels_at_once_and_kills_when_the_grace_ends() -> None:
    d = dog()
    assert d.step(101.0, stopping=True) is Step.CANCEL
    assert d.step(101.0, stopping=True) is None
    # The deadline still applies during the shutdown grace.
    assert d.step(d.interrupt_at, stopping=True) is Step.INTERRUPT
    assert d.step(d.kill_at, stopping=True) is Step.KILL


def test_shutdown_grace_ends_before_a_late_deadline() -> None:
    deadline = datetime.now(UTC) + timedelta(hours=1)
    d = Watchdog.for_deadline(deadline, timedelta(seconds=5), timedelta(seconds=25), now=0.0)
    assert d.step(0.0, stopping=True) is Step.CANCEL
    assert d.step(24.9, stopping=True) is None
    assert d.step(25.0, stopping=True) is Step.SHUTDOWN_KILL


def test_second_signal_kills_now() -> None:
    d = dog()
    assert d.step(101.0, stopping=True) is Step.CANCEL
    assert d.step(102.0, stopping=True, hurry=True) is Step.SHUTDOWN_KILL


def test_wait_for_names_the_next_step_capped_for_the_title() -> None:
    d = dog()
    assert d.wait_for(100.0) == 1.0
    assert abs(d.wait_for(d.interrupt_at - 0.25) - 0.25) < 1e-9
    d.step(d.interrupt_at)
    assert abs(d.wait_for(d.kill_at - 0.5) - 0.5) < 1e-9


def test_operator_cancel_tells_at_once_and_kills_a_kill_grace_later() -> None:
    d = dog()
    assert d.step(101.0, cancelled=True) is Step.CANCEL
    assert d.step(101.0, cancelled=True) is None  # told once
    assert d.wait_for(103.0) == 1.0  # capped; the kill is due at 106
    assert d.step(105.99, cancelled=True) is None
    assert d.step(106.0, cancelled=True) is Step.CANCEL_KILL


def test_cancel_during_shutdown_does_not_tell_twice_and_kills_after_the_kill_grace() -> None:
    d = dog()
    assert d.step(101.0, stopping=True) is Step.CANCEL
    assert d.step(102.0, stopping=True, cancelled=True) is None
    assert d.step(107.0, stopping=True, cancelled=True) is Step.CANCEL_KILL
