"""What this slotd needs of its database schema, and what a migration may do to the
replicas of the previous release still running beside it.

Within a release line migrations only add (expand): replicas of the previous release keep
working on the new schema, which is what lets `slotd migrate` run under a live fleet
(tests/test_upgrade.py runs the previous release's replicas through it). A removal or a
rename is split: the expand step adds the new thing and ships with code that no longer
needs the old one; a later release's contract step removes the old thing, and says so in
its header with a line `-- slotd: contract of NNN` (NNN: the expand step whose code no
longer uses what it removes). `slotd migrate` applies a contract step only while every
live replica runs code that carries migration NNN (each replica heartbeats the newest
migration its code carries; a release older than sql/013 heartbeats none), else it stops
before it, names the replicas and exits 2, unless `--force`. See sql/README.md."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from slotd.errors import SchemaNotMigrated

_CONTRACT = re.compile(r"^-- slotd: contract of (\d{3})\b")

# The errors a statement meets on a schema older than its code: a table, a column or a
# function a later migration adds. Any of them from one of slotd's own statements means
# exactly one thing to the operator.
_BEHIND = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
)
ADVICE = "run slotd migrate"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    body: str
    # A contract step: applied only while every live replica's code carries this migration.
    contract_of: int | None = None


def read(folder: Path) -> list[Migration]:
    """The numbered migrations in `folder`, in order, with what their headers declare."""
    found = []
    for path in sorted(folder.glob("[0-9][0-9][0-9]_*.sql")):
        body = path.read_text()
        found.append(Migration(int(path.name[:3]), path.stem, body, _contract_of(body)))
    return found


def _contract_of(body: str) -> int | None:
    # Only the header counts (the comment lines before the first statement), so a
    # statement's own comment can never turn a step into a contract by accident.
    for line in body.splitlines():
        if not line.startswith("--"):
            if line.strip():
                break
            continue
        match = _CONTRACT.match(line)
        if match:
            return int(match.group(1))
    return None


def missing(migrations: Sequence[Migration], applied: set[int]) -> list[str]:
    """The migrations this code carries that the database has not applied."""
    return [m.name for m in migrations if m.version not in applied]


def behind_message(names: Sequence[str]) -> str:
    return f"the database's slotd schema lacks {', '.join(names)}: {ADVICE}"


def too_old(fleet: Sequence[Mapping[str, Any]], needed: int) -> list[Mapping[str, Any]]:
    """Live replicas whose code predates migration `needed` (a release older than sql/013
    says nothing about its code: it is older than any contract step)."""
    return [r for r in fleet if (r.get("migration") or 0) < needed]


def describe(replica: Mapping[str, Any]) -> str:
    version = replica.get("version") or "0.1.x"
    return f"{replica.get('hostname')}:{replica.get('pid')} (slotd {version})"


def refusal(step: Migration, older: Sequence[Mapping[str, Any]]) -> str:
    assert step.contract_of is not None
    names = ", ".join(describe(r) for r in older)
    return (
        f"{step.name} is a contract step: it removes what replicas older than migration "
        f"{step.contract_of:03d} still use, and {len(older)} such replica"
        f"{' is' if len(older) == 1 else 's are'} alive: {names}; replace them first "
        "(or pass --force)"
    )


@contextmanager
def migrated() -> Iterator[None]:
    """Around one of slotd's own statements on a connection slotd did not open (the
    producer's): an object missing from the schema becomes one line saying what to do,
    at no cost to the statements that succeed."""
    try:
        yield
    except _BEHIND as exc:
        from slotd import db  # db needs the repository, which needs this module

        raise SchemaNotMigrated(
            f"slotd's schema in this database is missing or older than this slotd "
            f"({db.first_line(exc)}): {ADVICE}"
        ) from exc


def is_behind(exc: BaseException) -> bool:
    return isinstance(exc, _BEHIND)
