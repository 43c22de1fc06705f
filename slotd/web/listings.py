"""The dashboard's long lists, dead letters and live tasks: a page at a time by keyset (the
last row's sort key is the next page's cursor, so page 6,000 costs what page 1 does), and
searchable by type, id, key and, for dead letters, the start of the error line."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slotd.repository import DashboardReads
from slotd.repository.states import DEAD as DEAD_STATES

PAGE = 100
# How many dead letters one error search looks through: no index knows error text, so the
# search is a bounded walk of the listing's index, continued page by page.
ERROR_SCAN = 10_000
# How many tasks one search by state or tag looks through (newest first), page by page.
SEARCH_SCAN = 10_000
Cursor = tuple[datetime | None, int]


class BadCursor(ValueError):
    pass


def parse_cursor(text: str | None) -> Cursor | None:
    """`<ISO time>~<id>` (or `~<id>` for a row without a time), as `cursor_text` writes it."""
    if not text:
        return None
    at, sep, ident = text.rpartition("~")
    try:
        if not sep or not ident.isdigit():
            raise ValueError(text)
        return (datetime.fromisoformat(at) if at else None), int(ident)
    except ValueError:
        raise BadCursor(f"bad page cursor {text!r}: follow the page's own links") from None


def cursor_text(at: datetime | None, ident: int) -> str:
    return f"{at.isoformat() if at else ''}~{ident}"


@dataclass
class Search:
    task_type: str | None = None
    query: str | None = None  # an id, else a key
    error: str | None = None  # the start of the error line (dead letters)
    state: str | None = None  # one of slotd's states (the tasks page)
    tag: str | None = None  # enqueue(..., tags=[...]) (the tasks page)

    def params(self, key_types: list[str], as_key: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"task_type": self.task_type, "key_types": key_types}
        if self.query:
            if self.query.isdigit() and not as_key and len(self.query) <= 18:
                out["ids"] = [int(self.query)]
            else:
                out["key"] = self.query
        return out

    def link(self) -> dict[str, str]:
        """The search as query parameters, for the next page's link."""
        pairs = {
            "type": self.task_type, "q": self.query, "error": self.error, "state": self.state,
            "tag": self.tag,
        }  # fmt: skip
        return {k: v for k, v in pairs.items() if v}


def dead(
    reads: DashboardReads, search: Search, after: Cursor | None, limit: int = PAGE
) -> dict[str, Any]:
    types = reads.types()
    params = search.params(types)
    if search.error:
        params.update(error=search.error, scan=ERROR_SCAN)
    rows = reads.dead_page(params, after, limit)
    if search.query and search.query.isdigit() and not [r for r in rows if not r.get("window_end")]:
        # "123" may be a key too: an id that names no dead letter is searched as one.
        params.update(search.params(types, as_key=True), ids=None)
        rows = reads.dead_page(params, after, limit)
    window = next((r for r in rows if r.get("window_end")), None)
    rows = [r for r in rows if not r.get("window_end")]
    shorten(rows)
    following = None
    searched_to = None
    if len(rows) == limit:
        following = cursor_text(rows[-1]["retired_at"], rows[-1]["id"])
    elif window is not None and window["scanned"] >= ERROR_SCAN:
        # The search stopped at the end of its stretch, not at the end of the dead letters.
        following = cursor_text(window["retired_at"], window["id"])
        searched_to = window["retired_at"]
    filtered = bool(search.query or search.error)
    total = len(rows) if filtered else reads.dead_count(search.task_type)
    return {
        "rows": rows,
        "types": types,
        "total": total,
        "filtered": filtered,
        "capped": total >= reads.COUNT_CAP,
        "limit": limit,
        "next": following,
        "searched_to": searched_to,
        "searched_id": None,
        "scan": ERROR_SCAN,
        "paged": after is not None,
        "link": search.link(),
    }


def mark_states(rows: list[dict[str, Any]]) -> None:
    """How far each live task's due time is (its state is slotd's, fragment task_state), or,
    with none, what it waits on."""
    for row in rows:
        run_at = row["run_at"]  # None: infinity, it waits on something other than time
        row["due_s"] = None if run_at is None else (run_at - row["db_now"]).total_seconds()
        row["due_words"] = due_words(row) if run_at is None else None


def due_words(row: dict[str, Any]) -> str:
    """When a task with no due time (run_at infinity) runs: its event, its sequence's turn,
    else its parents (sql/019); a dead letter never."""
    if row.get("state") in DEAD_STATES:
        return "never: a dead letter"
    if row.get("wait_event"):  # an event wait without a timeout (sql/072)
        return "when its event is emitted"
    if row.get("sequence_waiting"):  # sql/080
        return "when its turn in its sequence comes"
    return "after its parents"


def shorten(rows: list[dict[str, Any]]) -> None:
    """A dead letter's error line, as long as a table cell can show it."""
    for row in rows:
        line = row["error_line"] or ""
        row["error_line"] = line if len(line) <= 160 else line[:159] + "…"


def tasks(
    reads: DashboardReads, search: Search, after: Cursor | None, limit: int = PAGE
) -> dict[str, Any]:
    """The tasks page: live tasks in due order; with a state or a tag, a search of live
    tasks and dead letters newest first; succeeded ones among the kept successes."""
    if search.state == "succeeded":
        return _walked(reads, search, after, limit, reads.kept_page, "kept")
    if search.state or search.tag:
        return _walked(reads, search, after, limit, reads.find, "found")
    types = reads.types()
    rows = reads.tasks_page(search.params(types), after, limit)
    if search.query and search.query.isdigit() and not rows:
        rows = reads.tasks_page({**search.params(types, as_key=True), "ids": None}, after, limit)
    mode = "live"
    if not rows and search.query and search.query.isdigit() and after is None:
        # A succeeded task kept by keep_result / keep_history is found by its id too.
        kept = reads.kept(int(search.query)) if len(search.query) <= 18 else None
        if kept is not None and search.task_type in (None, kept["task_type"]):
            rows, mode = [kept], "kept"
    elif not rows and search.query and after is None:
        # ...and by its key (stored beside its result, sql/091): the newest ones.
        walked = reads.kept_page(search.params(types), None, limit, SEARCH_SCAN)
        found = [r for r in walked if not r["window_end"]]
        if found:
            rows, mode = found, "kept"
    if mode == "live":
        mark_states(rows)
    following = cursor_text(rows[-1]["run_at"], rows[-1]["id"]) if len(rows) == limit else None
    return _listing(reads, search, rows, types, limit, following, None, after, mode)


def _walked(
    reads: DashboardReads,
    search: Search,
    after: Cursor | None,
    limit: int,
    walk: Any,
    mode: str,
) -> dict[str, Any]:
    """A search that walks at most SEARCH_SCAN rows newest first per page (a state is
    derived, no index knows it) and says where it stopped."""
    types = reads.types()
    after_id = after[1] if after else None
    params = {**search.params(types), "state": search.state, "tag": search.tag}
    rows = walk(params, after_id, limit, SEARCH_SCAN)
    if search.query and search.query.isdigit() and not [r for r in rows if not r["window_end"]]:
        params.update(search.params(types, as_key=True), ids=None)
        rows = walk(params, after_id, limit, SEARCH_SCAN)
    window = next((r for r in rows if r["window_end"]), None)
    rows = [r for r in rows if not r["window_end"]]
    following, searched = None, None
    if len(rows) == limit:
        following = cursor_text(None, rows[-1]["id"])
    elif window is not None and window["scanned"] >= SEARCH_SCAN:
        following, searched = cursor_text(None, window["id"]), window["id"]
    return _listing(reads, search, rows, types, limit, following, searched, after, mode)


def _listing(
    reads: DashboardReads,
    search: Search,
    rows: list[dict[str, Any]],
    types: list[str],
    limit: int,
    following: str | None,
    searched_id: int | None,
    after: Cursor | None,
    mode: str,
) -> dict[str, Any]:
    return {
        "rows": rows,
        "types": types,
        "limit": limit,
        "next": following,
        "searched_to": None,
        "searched_id": searched_id,
        "scan": SEARCH_SCAN,
        "paged": after is not None,
        "link": search.link(),
        "mode": mode,
    }
