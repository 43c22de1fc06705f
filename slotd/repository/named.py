"""Named statements: sql/ loaded once, its predicates and fragments spliced in, each
statement run by name. Every module of this package takes its SQL from `_sql`.

Schemas (SLOTD_SCHEMA): sql/ is written with bare `slotd_*` names. For `public` the
statements run as written (today's text, so deployments and their plans are unchanged). For
a named schema each statement is rewritten once, at load, to name its schema explicitly:
behind a transaction-mode pooler a session `search_path` lands on whichever server session
ran it, so no statement may rely on one. The rewrite touches only the objects the
migrations create (`objects()`), the notification channels and slotd's advisory-lock keys;
columns, indexes and functions of PostgreSQL are left alone."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import psycopg

from slotd.config import DEFAULT_SCHEMA, default_schema, validate_schema
from slotd.errors import ConfigError
from slotd.repository import composed

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


_IDENTIFIER_MAX = 63


def resolve_schema(schema: str | None) -> str:
    return default_schema() if schema is None else validate_schema(schema, source="schema")


def channel(base: str, schema: str | None = None) -> str:
    """A notification channel of `schema`: public keeps the bare name (replicas of the
    previous release listen on it), a named schema's is `<base>.<schema>`, so a fleet is
    never woken by another schema's enqueues."""
    schema = resolve_schema(schema)
    return base if schema == DEFAULT_SCHEMA else f"{base}.{schema}"


def qualified(name: str, schema: str | None = None) -> str:
    """An object of slotd as text naming its schema (for to_regclass and the like)."""
    schema = resolve_schema(schema)
    return name if schema == DEFAULT_SCHEMA else f'"{schema}".{name}'


_CREATES = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNLOGGED\s+|TEMP\s+)?"
    r"(?:TABLE|VIEW|MATERIALIZED\s+VIEW|SEQUENCE|TYPE|FUNCTION|PROCEDURE|DOMAIN)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?(slotd_\w+)",
    re.I,
)


@cache
def objects() -> frozenset[str]:
    """Every object of slotd a statement may name: what the migrations and the statements
    create (tables, views, sequences, types, functions). Indexes and constraints are not
    named in statements and cannot be qualified where they are created, so they are not
    rewritten; a new table is picked up from its migration without a list to keep."""
    folder = sql_dir()
    text = "\n".join(p.read_text() for p in sorted(folder.glob("*.sql")))
    return frozenset(m.group(1) for m in _CREATES.finditer(text))


def _object_pattern() -> re.Pattern[str]:
    names = sorted(objects(), key=len, reverse=True)
    # Whole identifiers only (an index named slotd_tasks_key is not slotd_tasks), and not
    # one already qualified by a schema.
    return re.compile(r"(?<![\w.\"$])(" + "|".join(map(re.escape, names)) + r")(?![\w$])")


# A channel is what pg_notify's first argument or a LISTEN names; any other `'slotd_...'`
# literal is left alone (and the test over every statement flags it).
_CHANNEL_LITERAL = re.compile(r"(pg_notify\(\s*)'(slotd_\w+)'", re.I)
_CHANNEL_LISTEN = re.compile(r"\b((?:UN)?LISTEN\s+)(slotd_\w+)\b", re.I)
_LOCK_KEY = re.compile(r"'slotd\.")


def rewrite(sql: str, schema: str) -> str:
    """`sql` naming `schema` explicitly: its objects qualified, its channels the schema's
    own, its advisory-lock keys (`'slotd.<what>...'`) the schema's own. Identity for
    public."""
    if schema == DEFAULT_SCHEMA:
        return sql

    def literal(match: re.Match[str]) -> str:
        return f"{match.group(1)}'{_checked_channel(channel(match.group(2), schema))}'"

    def listen(match: re.Match[str]) -> str:
        return f'{match.group(1)}"{_checked_channel(channel(match.group(2), schema))}"'

    # The schema itself, where a statement names it (CREATE SCHEMA, the migration's
    # search_path): quoted as an identifier, in a literal too.
    sql = sql.replace("'slotd_schema_name'", f"'\"{schema}\"'")
    sql = sql.replace("slotd_schema_name", f'"{schema}"')
    sql = _CHANNEL_LITERAL.sub(literal, sql)
    sql = _CHANNEL_LISTEN.sub(listen, sql)
    sql = _LOCK_KEY.sub(f"'slotd.{schema}.", sql)
    return _object_pattern().sub(f'"{schema}".\\1', sql)


def _checked_channel(name: str) -> str:
    if len(name.encode()) > _IDENTIFIER_MAX:
        raise ConfigError(f"channel {name!r} is longer than {_IDENTIFIER_MAX} bytes")
    return name


def unqualified(sql: str, schema: str) -> list[str]:
    """The `slotd_*` names a rewritten statement still leaves to a search_path (comments
    aside): for the test that pins the rewrite over every statement, present and future."""
    code = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())
    return [
        m.group(0)
        for m in re.finditer(r"(?<![\w$.\"])slotd_\w+", code)
        if not code.startswith(f".{schema}", m.end())
    ]


@cache
def statements(schema: str = DEFAULT_SCHEMA) -> dict[str, str]:
    """Every named statement, for `schema` (see the module's docstring): loaded and
    rewritten once per schema, so each keeps one text (psycopg prepares by text)."""
    if schema != DEFAULT_SCHEMA:
        validate_schema(schema, source="schema")
        return {name: rewrite(sql, schema) for name, sql in statements().items()}
    return _loaded()


@cache
def _loaded() -> dict[str, str]:
    """queries.sql, plus queries_*.sql for optional integrations (slotd.contrib): the named
    statements, and the claim and settle statements composed from its fragments
    (slotd.repository.composed), each with its `_shared` twin where it has one."""
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

    def splice(sql: str, shared: bool) -> str:
        # A predicate goes in parenthesised, so it composes inside any boolean expression;
        # a fragment (shared CTEs) goes in as written. Without `shared`, the shared limits'
        # parts are spliced as nothing (a predicate as true): see SHARED_PARTS.
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if not shared and name in SHARED_PARTS:
                return "true" if name in predicates else ""
            if name in fragments:
                return splice(fragments[name], shared)
            return "(" + splice(predicates[name], shared) + ")"

        return _SPLICE.sub(one, sql)

    out: dict[str, str] = {}
    built = composed.compose(lambda name: splice(fragments[name], shared=False))
    built_shared = composed.compose(lambda name: splice(fragments[name], shared=True))
    clash = sorted(blocks["name"].keys() & built.keys())
    if clash:
        raise ValueError(f"sql/ names statements the composer builds: {clash}")
    for name, sql in blocks["name"].items():
        out[name] = splice(sql, shared=False)
        with_shared = splice(sql, shared=True)
        if with_shared != out[name]:
            out[name + SHARED_SUFFIX] = with_shared
    for name, sql in built.items():  # the claim and settle paths (composed.py)
        out[name] = sql
        if built_shared[name] != sql:
            out[name + SHARED_SUFFIX] = built_shared[name]
    return out


# The shared limits' parts of a statement (Registry.limit, sql/queries_order.sql): spliced
# only into its twin named `<name>_shared`, which the repository runs for a registry that
# declares one. Under the plain name they are nothing: every table and index a statement
# names is opened on each execution, read or not, and the plain claim carrying them drained
# 20% slower (tests/bench/RESULTS.md).
SHARED_PARTS = frozenset(
    (
        # A group's burst above its cap (#39, Registry.group_bursts): as rare as a shared
        # limit, and its probes cost every plan that names them, so it rides the same twin.
        "group_burst_closed",
        "within_shared",
        "shared_open",
        "within_shared_rates",
        "shared_rate_starts",
        "shared_rate_waits",
    )
)
SHARED_SUFFIX = "_shared"


def _sql(name: str, schema: str | None = None) -> Any:
    """Statement `name` for `schema` (None: SLOTD_SCHEMA, else public)."""
    # psycopg's LiteralString typing does not follow strings loaded from a file.
    return statements(default_schema() if schema is None else schema)[name]


def _interval(value: timedelta) -> str:
    return f"{int(value.total_seconds() * 1000)}ms"


def _dicts(cur: Any) -> list[dict[str, Any]]:
    names = [col.name for col in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def execute(
    target: Executor,
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    schema: str | None = None,
) -> Any:
    """Run a named statement from sql/ and return the cursor: for integrations whose
    statements live in sql/queries_*.sql."""
    return target.execute(_sql(name, schema), params)
