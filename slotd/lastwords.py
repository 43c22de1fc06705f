"""A slot's last words: the outcome of the attempt it is about to settle, left in memory it
shares with its supervisor, for the supervisor to read only once the slot is dead.

Why not a message: the supervisor needs the outcome only when the slot dies between the
handler's end and its settlement (then a success is dequeued, never run again; see
Supervisor._settle_orphan), yet a message per task woke the supervisor once more per task
and cost both processes a pickle and a pipe write. A shared page is written without a
system call and read by nobody while the slot lives.

Layout: the lease token (16 bytes), the body's length (4 bytes), the pickled Result's fields. The
token is cleared first and written last, so a slot killed mid-write leaves words that match
no lease (the attempt then counts as a crash, as with no words at all), and words about an
earlier attempt of the same task never match a later lease's token."""

from __future__ import annotations

import mmap
import pickle
import uuid
from dataclasses import replace

from slotd.processor import Result
from slotd.repository import storable

SIZE = 64 * 1024
_TOKEN = slice(0, 16)
_LENGTH = slice(16, 20)
_BODY = 20
_NO_TOKEN = bytes(16)


class LastWords:
    """Made by the supervisor before it forks a slot; the fork shares the page."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, SIZE)  # anonymous and MAP_SHARED: the fork shares it

    def say(self, token: uuid.UUID, result: Result) -> None:
        """The slot, before it settles the attempt leased under `token`."""
        body = pickle.dumps(result.fields(), pickle.HIGHEST_PROTOCOL)
        if len(body) > SIZE - _BODY:  # a huge traceback: its head and tail are enough
            cut = replace(result, error=storable(result.error or "", 4000))
            body = pickle.dumps(cut.fields(), pickle.HIGHEST_PROTOCOL)
        page = self.page
        page[_TOKEN] = _NO_TOKEN
        page[_BODY : _BODY + len(body)] = body
        page[_LENGTH] = len(body).to_bytes(4, "little")
        page[_TOKEN] = token.bytes

    def heard(self, token: uuid.UUID) -> Result | None:
        """The supervisor, after the slot exited: its outcome for this lease, if it said one."""
        page = self.page
        if page.closed or page[_TOKEN] != token.bytes:
            return None
        length = int.from_bytes(page[_LENGTH], "little")
        try:
            return Result(*pickle.loads(page[_BODY : _BODY + length]))
        except Exception:  # noqa: BLE001 - torn words are no words: the attempt crashed
            return None

    def close(self) -> None:
        self.page.close()
