"""Token coalescing, without processes: the rules the supervisor's wake relies on."""

from slotd.supervisor.wake import Tokens


def test_a_token_wakes_exactly_one_idle_slot_warmest_first() -> None:
    sent: list[int] = []
    tokens = Tokens(sent.append)
    for n in (0, 1, 2):
        tokens.slot_idle(n)
    assert tokens.offer() is True
    assert sent == [2]
    assert tokens.idle == [0, 1]


def test_a_burst_while_all_busy_becomes_one_pending_token() -> None:
    sent: list[int] = []
    tokens = Tokens(sent.append)
    for _ in range(1000):
        tokens.offer()
    assert sent == []
    tokens.slot_idle(3)
    tokens.slot_idle(4)
    assert sent == [3]  # one discovery for the whole burst
    assert tokens.idle == [4]


def test_ticker_and_cascade_tokens_are_dropped_when_all_busy() -> None:
    sent: list[int] = []
    tokens = Tokens(sent.append)
    assert tokens.offer(remember=False) is False
    tokens.slot_idle(0)
    assert sent == []
    assert tokens.idle == [0]


def test_a_dead_slot_is_never_woken() -> None:
    sent: list[int] = []
    tokens = Tokens(sent.append)
    tokens.slot_idle(0)
    tokens.slot_gone(0)
    tokens.offer()
    assert sent == []
