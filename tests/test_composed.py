"""The claim and settle statements composed from parts (slotd/repository/composed.py, #37
item 3): a plain task's statements are the very texts they were as named statements, every
composed statement is one the server takes, and no combination is named in sql/ any more."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import psycopg

from slotd.repository import composed, named, statements

# What psycopg sends for each of a plain task's statements (placeholders numbered as
# psycopg numbers them), as the named statements `claim`, `claim_rated`, `dequeue`,
# `dequeue_claim`, `dequeue_claim_rated` and `record_failure` were on main 0639e0e, just
# before the composition (the shared limits' parts spliced as nothing): the hot path pays
# for no feature. A change here is a change of the hot path: measure it
# (tests/bench/cpu_per_task.py, run.py --only floor) and say so. Changed once since: the
# claims read the lease they take over (fragment lapsed_lease, two columns; #37's lapsed
# attempts remembered), measured by tests/bench/lapse_cost.py (tests/bench/RESULTS.md); and
# within_limits' per-group branch names the burst (group_burst_closed, #39), spliced as
# `true` here (`OR NOT true`, folded away by the planner) and carried by the _shared twins
# only: with its probes in every claim PostgreSQL spent 210 -> 231 µs per plain task.
PLAIN_PATH = {
    composed.claimed("plain"): "f06f1866a698cc9f09ad749d71801a254dddd22094e9972d3b95c5a13167fa5d",
    composed.claimed("rated"): "06751e6d8ad0285bbf40b1e31e9da80d048916e1842d28656a25c0767e64b8fb",
    composed.succeeded("plain"): "532ede50d400d6827630c0d0a65e4aff6a898bf650ae229656e94cc46e1c5fa2",
    composed.succeeded(
        "plain", "plain"
    ): "0087d9dd23d289bf19a734fc67911fcb117f2fccc5e3e88bfcef0da3e3507042",
    composed.succeeded(
        "plain", "rated"
    ): "e9e590a5ca7422951a1a7d50bb9e7c39b1c019791daed72ddf3d9ff235443657",
    composed.failed("plain"): "f10c5c997d720dbd3509eb1d592fd1ababc092fd1d391a84e41bec69b632fe19",
}

# The named statements the settle and claim paths had before the composition: 15.
ENUMERATED = [
    "claim",
    "claim_rated",
    "dequeue",
    "dequeue_claim",
    "dequeue_claim_rated",
    "dequeue_keep",
    "dequeue_keep_claim",
    "dequeue_keep_claim_rated",
    "dequeue_linked",
    "dequeue_linked_claim",
    "dequeue_linked_claim_rated",
    "dequeue_member_claim",
    "dequeue_member_claim_rated",
    "record_failure",
    "record_failure_linked",
]


def sent(sql: str) -> str:
    """`sql` as psycopg sends it: %(name)s as $n, numbered by first appearance; %% as %."""
    order: dict[str, int] = {}

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        return f"${order.setdefault(match.group(1), len(order) + 1)}"

    return re.sub(r"%%|%\((\w+)\)s", one, sql)


def all_composed(shared: bool = False) -> list[str]:
    """The composed statements (with their `_shared` twins: `shared`)."""
    return [
        name
        for name in statements()
        if name.startswith(("claim.", "succeeded.", "failed."))
        and (shared or not name.endswith("_shared"))
    ]


def test_a_plain_tasks_statements_are_the_texts_they_were() -> None:
    found = {
        name: hashlib.sha256(sent(statements()[name]).encode()).hexdigest() for name in PLAIN_PATH
    }
    assert found == PLAIN_PATH
    # A plain success names no table of a feature the task does not use (a failure keeps
    # its attempt, sql/030; a claim reads a dependant's parents' values, sql/019).
    for name in (composed.succeeded("plain"), composed.succeeded("plain", "plain")):
        for table in ("slotd_results", "slotd_attempts", "slotd_batch", "slotd_rate"):
            assert table not in statements()[name], (name, table)


def test_no_combination_is_named_in_sql_any_more() -> None:
    assert [name for name in ENUMERATED if name in statements()] == []
    # #39's fair claims were named (claim_fair, claim_fair_rated) and could not ride on a
    # settlement; they are claim parts now.
    assert {"claim_fair", "claim_fair_rated"}.isdisjoint(statements())
    # 4 success parts x (no claim, plain, rated, fair, fair_rated) + 2 failure parts + 4
    # claims alone.
    assert len(all_composed()) == 4 * 5 + 2 + 4
    assert composed.succeeded("plain", "fair") == "succeeded.plain+claim.fair"
    assert composed.succeeded("member", "rated") == "succeeded.member+claim.rated"


def test_every_composed_statement_is_one_the_server_takes(conn: psycopg.Connection[Any]) -> None:
    # PREPARE parses, resolves every name and type, and plans: a part that does not fit
    # another (a CTE it reads missing, a told item naming nothing) fails here.
    for i, name in enumerate(all_composed(shared=True)):
        conn.execute(f"PREPARE composed_{i} AS {sent(statements()[name])}")  # type: ignore[arg-type]


def test_parts_compose_as_the_module_says() -> None:
    s = statements()
    linked = s[composed.failed("linked")]
    assert linked.startswith("WITH RECURSIVE backoff AS (") and linked.count("RECURSIVE") == 1
    assert s[composed.failed("plain")].startswith("WITH backoff AS (")
    # A part's told items are read by its answer, with or without a claim riding on it.
    for claim in (None, "plain", "rated"):
        text = s[composed.succeeded("kept", claim)]
        assert text.endswith("(SELECT count(*) FROM told) results"), claim
    # The plain success alone is the lone delete; with a claim it is a CTE.
    assert s[composed.succeeded("plain")].startswith("DELETE FROM slotd_tasks t")
    assert s[composed.succeeded("plain", "plain")].startswith("WITH done AS (")


def test_a_named_schema_rewrites_the_composed_statements() -> None:
    jobs = named.statements("jobs")
    for name in all_composed(shared=True):
        assert named.unqualified(jobs[name], "jobs") == [], name
