"""Named statements: sql/ loaded once, its predicates and fragments spliced in, each
statement run by name. Every module of this package takes its SQL from `_sql`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import psycopg

_BLOCK = re.compile(r"^-- (name|predicate|fragment): (\S+)\s*$", re.M)
_SPLICE = re.compile(r"\{(\w+)\}")

Executor = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncExecutor = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]


def sql_dir() -> Path:
    """sql/ next to the package in a checkout, slotd/sql inside an installed wheel."""
    here = Path(__file__).resolve().parent.parent  # slotd/, this package's parent
    for candidate in (here / "sql", here.parent / "sql"):
        if (candidate / "queries.sql").exists():
            return candidate
    raise FileNotFoundError("slotd's sql/ directory is missing from this installation")


@cache
def statements() -> dict[str, str]:
    """queries.sql, plus queries_*.sql for optional integrations (slotd.contrib)."""
    folder = sql_dir()
    files = [folder / "queries.sql", *sorted(folder.glob("queries_*.sql"))]
    text = "\n".join(path.read_text() for path in files)
    blocks: dict[str, dict[str, str]] = {"name": {}, "predicate": {}, "fragment": {}}
    marks = list(_BLOCK.finditer(text))
    for mark, nxt in zip(marks, [*marks[1:], None], strict=True):
        body = text[mark.end() : nxt.start() if nxt else len(text)]
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        blocks[mark.group(1)][mark.group(2)] = "\n".join(lines).strip()
    predicates, fragments = blocks["predicate"], blocks["fragment"]

    def splice(sql: str) -> str:
        # A predicate goes in parenthesised, so it composes inside any boolean expression;
        # a fragment (shared CTEs) goes in as written.
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in fragments:
                return splice(fragments[name])
            return "(" + splice(predicates[name]) + ")"

        return _SPLICE.sub(one, sql)

    return {name: splice(sql) for name, sql in blocks["name"].items()}


def _sql(name: str) -> Any:
    # psycopg's LiteralString typing does not follow strings loaded from a file.
    return statements()[name]


def _interval(value: timedelta) -> str:
    return f"{int(value.total_seconds() * 1000)}ms"


def _dicts(cur: Any) -> list[dict[str, Any]]:
    names = [col.name for col in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def execute(target: Executor, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Run a named statement from sql/ and return the cursor: for integrations whose
    statements live in sql/queries_*.sql."""
    return target.execute(_sql(name), params)
