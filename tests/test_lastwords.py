"""A slot's last words: the outcome it leaves in its ledger before settling, which the
supervisor reads only after the slot died (tests/test_chaos.py kills slots between the two)."""

from __future__ import annotations

import os
import uuid

from slotd.outcome import CRASHED, Result
from slotd.slot.ledger import WORDS_AT, WORDS_MAX, Ledger


def test_words_cross_a_fork_and_are_heard_for_their_own_lease_only() -> None:
    words = Ledger()
    token, later = uuid.uuid4(), uuid.uuid4()
    pid = os.fork()
    if pid == 0:  # the slot: says one outcome, then dies without a word of goodbye
        words.say(token, Result("done", duration=0.25))
        os._exit(0)
    os.waitpid(pid, 0)
    heard = words.heard(token)
    assert heard is not None and (heard.kind, heard.duration) == ("done", 0.25)
    # A later attempt of the same task (a new lease) is never settled by earlier words.
    assert words.heard(later) is None
    words.say(later, Result(CRASHED, "its runner died"))
    assert words.heard(token) is None
    assert words.heard(later) == Result(CRASHED, "its runner died")


def test_torn_or_oversized_words_are_no_words_or_cut_to_fit() -> None:
    words = Ledger()
    token = uuid.uuid4()
    words.say(token, Result("error", "x" * (4 * WORDS_MAX)))  # a traceback bigger than the page
    heard = words.heard(token)
    assert heard is not None and heard.kind == "error" and "characters cut" in (heard.error or "")
    # A slot killed mid-write has cleared the token first: nothing matches.
    words.page[WORDS_AT : WORDS_AT + 16] = bytes(16)
    assert words.heard(token) is None
    words.close()
    assert words.heard(token) is None
