"""The claim and settle statements, composed from parts instead of enumerated per
combination of features (#37). The SQL stays in sql/queries.sql as named fragments; this
module only says which fragments make which statement, once, at load (named.statements
holds every composed text beside the named ones, so each keeps one text, is rewritten for
a named schema like any other and is prepared by psycopg like any other).

A statement is

    WITH <settlement part's CTEs>[, <claim part's CTEs>]
    <answer>[, <the settlement part's told items>]

- the settlement part: what a task's end writes, by the features the task uses. It
  defines `done` (a success: the rows it ended) or `failed` (a failure). Successes:
  `plain` (the fenced delete), `kept` (and its result or history stored, keep_result /
  keep_history), `linked` (a task with dependants or of a batch: edges, dependants
  released, batch counted), `member` (a batch's member with nothing else linked: the
  delete and its stripe's count only). Failures: `plain`, `linked` (dependants cancelled
  transitively, batch counted).
- the claim part riding on a success: none, `plain` (`claim_ctes`) or `rated`
  (`claim_ctes_rated`, for candidates that may be of a rated type: only it names the rate
  tables), and their twins `fair` / `fair_rated` (`claim_ctes_fair*`, for candidates that
  may be of a fair type: the group's turn stamped in the claim's statement; only they name
  slotd_turns). A claim alone is the claim part with no settlement.
- the answer: a success alone answers `dequeued` (how many rows it ended), with a claim
  `dequeued` and the claimed row's columns (NULL: none claimed); a failure answers the
  failed row's attempt_count, max_attempts, run_at (no row: the lease is not ours); a claim
  alone the claimed row (or none).
- told items: FROM items the answer reads so that the part's notifications (SELECT CTEs
  calling pg_notify, which run only when read) are sent.

A part may stand alone in its own form (`<fragment>_alone`): a plain success with no claim
is the lone DELETE, answered by its row count. A part whose CTEs recurse begins with
RECURSIVE; it is written first, after WITH RECURSIVE. Every plain task's statement
(`claimed("plain")`, `succeeded("plain")`, `succeeded("plain", "plain")`,
`failed("plain")`) is byte for byte the text it had as a named statement:
tests/test_composed.py pins their hashes, so the hot path pays for no feature.

The API, for the repository's settlements and for new parts:

    succeeded(part, claim=None) -> statement name    failed(part) -> statement name
    claimed(claim) -> statement name                 compose(fragment) -> {name: text}

A new part (a sequence's release, a batched settlement...) is one entry in SUCCEEDED,
FAILED or CLAIMS naming its fragments in sql/, and it composes with every part of the
other kind; the names are `succeeded.<part>[+claim.<claim>]`, `failed.<part>`,
`claim.<claim>`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """A settlement part: its CTEs' fragment, the FROM items its answer reads (`told`), and
    its own form when no claim rides on it (`alone`)."""

    ctes: str
    told: str | None = None
    alone: str | None = None


SUCCEEDED = {
    "plain": Part("settled_plain", alone="settled_plain_alone"),
    "kept": Part("settled_kept", told="settled_kept_told"),
    "linked": Part("settled_linked", told="settled_linked_told"),
    "member": Part("settled_member", told="settled_member_told"),
}
FAILED = {
    "plain": Part("failed_plain"),
    "linked": Part("failed_linked", told="failed_linked_told"),
}
CLAIMS = {
    "plain": "claim_ctes",
    "rated": "claim_ctes_rated",
    # A fair type's claim stamps its group's turn (#39, sql/queries_order.sql): only these
    # name slotd_turns.
    "fair": "claim_ctes_fair",
    "fair_rated": "claim_ctes_fair_rated",
}

_RECURSIVE = "RECURSIVE "


def _name(family: str, part: str, claim: str | None) -> str:
    return f"{family}.{part}" + (f"+claim.{claim}" if claim else "")


# Looked up on every settlement: a dict probe, no string built (KeyError: no such part).
_SUCCEEDED = {
    (part, claim): _name("succeeded", part, claim)
    for part in SUCCEEDED
    for claim in (None, *CLAIMS)
}
_FAILED = {part: _name("failed", part, None) for part in FAILED}
_CLAIMED = {claim: f"claim.{claim}" for claim in CLAIMS}


def succeeded(part: str, claim: str | None = None) -> str:
    """The statement that settles a success by settlement part `part`, with the claim part
    `claim` riding on it (None: no claim)."""
    return _SUCCEEDED[part, claim]


def failed(part: str) -> str:
    """The statement that settles a failed attempt by failure part `part`."""
    return _FAILED[part]


def claimed(claim: str) -> str:
    """The claim alone, by claim part `claim`."""
    return _CLAIMED[claim]


def _with(parts: list[str]) -> str:
    recursive = any(p.startswith(_RECURSIVE) for p in parts)
    body = ", ".join(p.removeprefix(_RECURSIVE) for p in parts)
    return ("WITH RECURSIVE " if recursive else "WITH ") + body


def _statement(fragment: Callable[[str], str], part: Part, claim: str | None, answer: str) -> str:
    if claim is None and part.alone is not None:
        return fragment(part.alone)
    ctes = [fragment(part.ctes)] + ([fragment(CLAIMS[claim])] if claim else [])
    told = f", {fragment(part.told)}" if part.told else ""
    return f"{_with(ctes)}\n{fragment(answer)}{told}"


def compose(fragment: Callable[[str], str]) -> dict[str, str]:
    """Every composed statement's text, from `fragment` (a fragment's text by name, its own
    splices done)."""
    out: dict[str, str] = {}
    for (part, claim), name in _SUCCEEDED.items():
        answer = "settled_claimed_answer" if claim else "settled_answer"
        out[name] = _statement(fragment, SUCCEEDED[part], claim, answer)
    for part, name in _FAILED.items():
        out[name] = _statement(fragment, FAILED[part], None, "failed_answer")
    for claim, name in _CLAIMED.items():
        out[name] = f"{_with([fragment(CLAIMS[claim])])}\n{fragment('claimed_answer')}"
    return out
