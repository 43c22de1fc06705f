"""Several queues in one database, each in its own schema (SLOTD_SCHEMA): every statement
names its schema (no search_path, so it holds behind a transaction-mode pooler), each
schema has its own notification channels, and `public` keeps today's names and text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import slotd
from slotd import repository
from slotd.cli import main
from slotd.dev.localpg import LocalPostgres
from slotd.errors import ConfigError
from slotd.repository import named
from tests.daemon import EXECUTIONS, ROOT, Daemon, wait_for
from tests.pgbouncer import PgBouncer, binary, pgbouncer

pytest_plugins = ["pytester"]


@pytest.fixture
def empty_db(pg_server: LocalPostgres) -> str:
    """A database with nothing of slotd in it (not a copy of the migrated template)."""
    name = f"slotd_schemas_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        repository.create_database(conn, name)
    return str(pg_server.url(name))


def slotd_in(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """slotd's relations, functions and types in `schema`."""
    rows = conn.execute(
        """
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND c.relname LIKE 'slotd%%'
        UNION ALL
        SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(s)s AND p.proname LIKE 'slotd%%'
        UNION ALL
        SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = %(s)s AND t.typname LIKE 'slotd%%'
        """,
        {"s": schema},
    ).fetchall()
    return sorted(row[0] for row in rows)


def cli(url: str, schema: str | None, *args: str) -> Any:
    env = {"SLOTD_DATABASE_URL": url, "SLOTD_DATABASE_URL_READ": None, "SLOTD_SCHEMA": schema}
    return CliRunner().invoke(main, list(args), env=env)


# the rewrite


def test_every_statement_of_a_named_schema_names_it() -> None:
    # Every statement in sql/, those other branches add included: a `slotd_*` name left
    # bare would resolve through a search_path (in public, or nowhere behind a pooler).
    for schema in ("jobs", "order"):  # a reserved word works: the schema is always quoted
        found = {
            name: named.unqualified(sql, schema)
            for name, sql in named.statements(schema).items()
            if named.unqualified(sql, schema)
        }
        assert found == {}
    assert {"slotd_tasks", "slotd_schema_migrations", "slotd_results"} <= named.objects()
    enqueue = named.statements("jobs")["enqueue"]
    assert "pg_notify('slotd_wake.jobs'" in enqueue
    assert "pg_get_serial_sequence('\"jobs\".slotd_tasks'" in enqueue
    assert named.statements("jobs")["listen"] == 'LISTEN "slotd_wake.jobs"'
    assert "'slotd.jobs.limit:'" in named.statements("jobs")["claim_lock"]


def test_a_statement_naming_slotd_objects_is_always_run_with_a_schema() -> None:
    # `_sql("name")` falls back to SLOTD_SCHEMA: right in the daemon, wrong for a caller
    # that was given its own schema (a test mode's Settings, a producer's schema=). So in
    # the repository only statements that name nothing of slotd may be looked up bare.
    import re

    bare = set()
    for path in (ROOT / "slotd" / "repository").glob("*.py"):
        bare |= set(re.findall(r'_sql\("([a-z_]+)"\)', path.read_text()))
    statements = named.statements()
    naming = {n for n in bare if named.unqualified(statements[n], "-")}
    assert naming == set()


def test_public_statements_are_todays_text() -> None:
    # Existing deployments, their replicas of 0.1.0 and their prepared plans: unchanged.
    assert named.statements("public") == named.statements() == named._loaded()
    assert named.statements("public")["listen"] == "LISTEN slotd_wake"
    assert named.channel("slotd_wake", "public") == "slotd_wake"
    assert named.channel("slotd_control", "jobs") == "slotd_control.jobs"


@pytest.mark.parametrize(
    "bad", ["Jobs", "1jobs", "pg_jobs", "a-b", "jobs;drop", "j" * 49, "", " jobs", "jöbs"]
)
def test_a_schema_name_must_be_a_plain_identifier(bad: str) -> None:
    with pytest.raises(ConfigError, match="bad schema"):
        named.resolve_schema(bad)


def test_a_bad_SLOTD_SCHEMA_is_one_line_and_exit_2(empty_db: str) -> None:
    result = cli(empty_db, "Bad-Schema", "status")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "bad SLOTD_SCHEMA 'Bad-Schema'" in lines[0], result.output


# migrations


def test_migrate_puts_every_object_in_the_schema_and_nothing_in_public(empty_db: str) -> None:
    result = cli(empty_db, "jobs", "migrate")
    assert result.exit_code == 0, result.output
    assert cli(empty_db, "jobs", "migrate").output.strip() == "schema up to date"
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert slotd_in(conn, "public") == []
        present = set(slotd_in(conn, "jobs"))
        assert named.objects() <= present
        applied = conn.execute('SELECT count(*) FROM "jobs".slotd_schema_migrations').fetchone()
        assert applied == (len(repository.migrations()),)


def test_migrate_leaves_the_callers_search_path_as_it_was(empty_db: str) -> None:
    # Inside the caller's transaction (the pytest plugin's shape): the migration's
    # search_path must not outlive it, or a statement the rewrite missed would pass here.
    with psycopg.connect(empty_db) as conn:
        was = conn.execute("SHOW search_path").fetchone()
        repository.migrate(conn, schema="jobs")
        assert conn.execute("SHOW search_path").fetchone() == was
        assert repository.schema_present(conn, schema="jobs")
        assert not repository.schema_present(conn, schema="public")
        assert repository.unapplied_migrations(conn, schema="jobs") == []


# producers and channels


def test_a_schema_wakes_only_its_own_listeners(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        for schema in ("alpha", "beta"):
            repository.migrate(conn, schema=schema)
    with (
        psycopg.connect(empty_db, autocommit=True) as listener,
        psycopg.connect(empty_db, autocommit=True) as conn,
    ):
        repository.listen(listener, schema="beta")
        slotd.enqueue(conn, "t.one", {"n": 1}, schema="alpha")
        beta_id = slotd.enqueue(conn, "t.one", {"n": 2}, schema="beta")
        # Delivered in commit order: alpha's wake, had it reached beta, would come first.
        notes = list(listener.notifies(timeout=10, stop_after=1))
        assert [n.channel for n in notes] == ["slotd_wake.beta"]
        rows = {
            s: conn.execute(f'SELECT id, payload FROM "{s}".slotd_tasks').fetchall()
            for s in ("alpha", "beta")
        }
        assert rows == {"alpha": [(1, {"n": 1})], "beta": [(beta_id, {"n": 2})]}


def test_enqueue_reads_SLOTD_SCHEMA_and_an_explicit_schema_wins(
    empty_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        repository.migrate(conn, schema="alpha")
        repository.migrate(conn, schema="beta")
        monkeypatch.setenv("SLOTD_SCHEMA", "alpha")
        slotd.enqueue(conn, "t.one")
        slotd.enqueue_many(conn, [("t.two", {}), ("t.two", {})], schema="beta")
        counts = {
            s: conn.execute(f'SELECT count(*) FROM "{s}".slotd_tasks').fetchone()[0]  # type: ignore[index]
            for s in ("alpha", "beta")
        }
        assert counts == {"alpha": 1, "beta": 2}
        with pytest.raises(ConfigError):
            slotd.enqueue(conn, "t.one", schema="Nope")


# two fleets, through real `slotd run`


@pytest.fixture(scope="module")
def tx_bouncer(pg_server: LocalPostgres) -> Iterator[PgBouncer | None]:
    if binary() is None:
        yield None
        return
    with pgbouncer(pg_server, "transaction") as bouncer:
        yield bouncer


def migrate_cli(url: str, schema: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "slotd", "migrate"],
        env={**os.environ, "SLOTD_DATABASE_URL": url, "SLOTD_SCHEMA": schema},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


def status(url: str, schema: str | None) -> Any:
    env = {**os.environ, "SLOTD_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    env.pop("SLOTD_SCHEMA", None)
    if schema:
        env["SLOTD_SCHEMA"] = schema
    return subprocess.run(
        [sys.executable, "-m", "slotd", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("through", ["direct", "pgbouncer-transaction"])
def test_two_fleets_in_two_schemas_drain_their_own_tasks_only(
    empty_db: str,
    daemons: list[Daemon],
    tx_bouncer: PgBouncer | None,
    through: str,
) -> None:
    if through != "direct" and tx_bouncer is None:
        pytest.skip("pgbouncer is not installed (apt-get install -y pgbouncer)")
    url = empty_db if tx_bouncer is None or through == "direct" else tx_bouncer.url_for(empty_db)
    fleets = ("alpha", "beta")
    for schema in fleets:
        migrate_cli(url, schema)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(EXECUTIONS)  # the application's own table
        assert slotd_in(conn, "public") == []
        ids = {
            schema: slotd.enqueue_many(
                conn, [("sc.mark", {"fleet": schema}) for _ in range(count)], schema=schema
            )
            for schema, count in zip(fleets, (12, 7), strict=True)
        }
        # Not served by either fleet: what each `slotd status` must count as its own.
        for schema, count in zip(fleets, (3, 5), strict=True):
            slotd.enqueue_many(conn, [("sc.later", {}, 3600)] * count, schema=schema)
    env = {
        "SLOTD_TEST_DIRECT_URL": empty_db,
        # Only a wake on the schema's own channel gets a task run before this backstop.
        "SLOTD_POLL_INTERVAL": "5m",
    }
    if url != empty_db:
        env["SLOTD_DATABASE_URL_LISTEN"] = empty_db  # LISTEN cannot go through the pool
    started = {}
    for schema in fleets:
        daemon = Daemon(
            url, slots=2, app="tests.apps.schemas:registry", env={**env, "SLOTD_SCHEMA": schema}
        )
        daemons.append(daemon)
        started[schema] = daemon.start()
    with psycopg.connect(empty_db, autocommit=True) as conn:
        # Enqueued after both fleets listen: run within seconds only if the wake arrived.
        for schema in fleets:
            ids[schema] += slotd.enqueue_many(
                conn, [("sc.mark", {"fleet": schema})] * 4, schema=schema
            )

        def ran() -> list[tuple[Any, ...]]:
            rows = conn.execute("SELECT note, task_id, pid FROM executions").fetchall()
            return rows if len(rows) >= sum(map(len, ids.values())) else []

        rows = wait_for(ran, timeout=60, what="both fleets' tasks")
        for schema, daemon in started.items():
            mine = [(task_id, pid) for note, task_id, pid in rows if note == schema]
            assert sorted(t for t, _ in mine) == sorted(ids[schema])  # each once
            tree = {p.pid for p in daemon.tree()} | daemon.known
            assert {pid for _, pid in mine} <= tree, (schema, mine, tree)
        assert slotd_in(conn, "public") == []
    for schema, count in zip(fleets, (3, 5), strict=True):
        done = status(url, schema)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["pending"] == {"sc.later": count}
        assert report["schema"] == schema
        assert report["running"] == {}
    # public holds nothing of slotd: a command there says so, in one line, exit 2.
    done = status(url, None)
    assert done.returncode == 2 and "run slotd migrate" in done.stderr
    for daemon in started.values():
        log = "\n".join(daemon.lines)
        assert "Traceback" not in log and "_pg3_" not in log


# the pytest plugin

PLUGIN_CONFTEST = """
import os
from datetime import timedelta

import psycopg
import pytest

import slotd
from slotd.repository import migrate

registry = slotd.Registry()


@registry.handler("hello", ceiling=timedelta(seconds=5))
def hello(task, ctx):
    return None


@pytest.fixture(scope="session")
def _slotd_schema():
    with psycopg.connect(os.environ["SCHEMA_TEST_URL"], autocommit=True) as conn:
        migrate(conn)  # into SLOTD_SCHEMA


@pytest.fixture
def slotd_conn(_slotd_schema):
    with psycopg.connect(os.environ["SCHEMA_TEST_URL"]) as conn, conn.transaction(
        force_rollback=True
    ):
        yield conn


@pytest.fixture
def slotd_registry():
    return registry
"""

PLUGIN_TESTS = """
import slotd
from slotd import Outcome


def test_eager(slotd_eager, slotd_conn):
    slotd.enqueue(slotd_conn, "hello", {"n": 1})
    [(task, settlement)] = slotd_eager.settlements
    assert settlement.outcome is Outcome.SUCCESS
    assert slotd_conn.execute('SELECT count(*) FROM "app_jobs".slotd_tasks').fetchone() == (0,)


def test_manual(task_queue, slotd_conn):
    slotd.enqueue(slotd_conn, "hello", {"n": 2})
    assert [t.payload for t in task_queue.pending()] == [{"n": 2}]
    assert task_queue.deliver_next().outcome is Outcome.SUCCESS
    assert task_queue.pending() == []
"""


def test_the_pytest_plugin_runs_in_SLOTD_SCHEMA(
    pytester: pytest.Pytester, empty_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTD_SCHEMA", "app_jobs")
    monkeypatch.setenv("SCHEMA_TEST_URL", empty_db)
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(test_app=PLUGIN_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert slotd_in(conn, "public") == []
        assert "slotd_tasks" in slotd_in(conn, "app_jobs")


# moving a live queue


def docs_move_sql() -> str:
    text = (ROOT / "docs/how-to/several-queues.md").read_text()
    start = text.index("   BEGIN;\n   CREATE SCHEMA IF NOT EXISTS jobs;")
    end = text.index("COMMIT;", start) + len("COMMIT;")
    return "\n".join(line[3:] for line in text[start:end].splitlines())


def test_the_docs_move_to_a_schema_keeps_every_task(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        repository.migrate(conn, schema="public")
        kept = slotd.enqueue_many(conn, [("t.move", {"n": n}) for n in range(3)])
        conn.execute(
            "UPDATE slotd_tasks SET attempt_count = max_attempts, last_error = 'boom'"
            " WHERE id = %s",
            (kept[0],),
        )
        conn.execute(docs_move_sql())  # type: ignore[arg-type]
        assert slotd_in(conn, "public") == []
        applied = repository.migrate(conn, schema="jobs")  # as the docs say
        assert applied == ["041_sql_enqueue", "072_waits", "090_task_state"]
        assert named.objects() <= set(slotd_in(conn, "jobs"))
        assert repository.unapplied_migrations(conn, schema="jobs") == []
        later = slotd.enqueue(conn, "t.move", {"n": 3}, schema="jobs")
        assert later > max(kept)  # the id sequence moved with its table
    report = cli(empty_db, "jobs", "status", "--json")
    assert report.exit_code == 0, report.output
    counts = json.loads(report.output)
    assert (counts["pending"], counts["dead"]) == ({"t.move": 3}, {"t.move": 1})


# the dashboard


def test_the_dashboards_pages_read_SLOTD_SCHEMA(
    empty_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    pytest.importorskip("starlette", reason="the dashboard needs the web extra")
    with warnings.catch_warnings():
        # Starlette 1.x would rather its test client ran on httpx2; httpx works the same.
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from slotd.web import create_app
    from slotd.web.settings import DashboardSettings

    monkeypatch.setenv("SLOTD_SCHEMA", "ops_jobs")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        repository.migrate(conn)
        live = slotd.enqueue(conn, "ops.report", {"n": 1})
        gone = slotd.enqueue(conn, "ops.audit", {}, max_attempts=1)
        conn.execute(
            "UPDATE \"ops_jobs\".slotd_tasks SET attempt_count = 1, last_error = 'boom'"
            " WHERE id = %s",
            (gone,),
        )
        assert slotd_in(conn, "public") == []
    app = create_app(empty_db, settings=DashboardSettings(actions=True))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        pages = {path: client.get(path) for path in ("/", "/tasks", "/dead", "/running")}
        pages["task"] = client.get(f"/tasks/{live}")
        pages["schedules"] = client.get("/schedules")
        assert {path: page.status_code for path, page in pages.items()} == dict.fromkeys(pages, 200)
        assert "ops.report" in pages["/tasks"].text and "ops.audit" in pages["/dead"].text
        client.app.state.dashboard.close()  # type: ignore[attr-defined]
