"""The fleet's versions and the schema's: every replica says which slotd it runs, `slotd
migrate` will not remove what live older replicas still use, and code newer than its
schema says "run slotd migrate" in one line instead of failing on its first statement."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import slotd
from slotd.cli import main
from slotd.dev.localpg import LocalPostgres
from slotd.errors import SchemaNotMigrated
from slotd.repository import create_database, migrations, newest_migration
from slotd.upgrade import guard as upgrades
from tests.daemon import ROOT, Daemon, wait_for

FIRST_OF_THIS_RELEASE = 13


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotd", *args],
        env={**os.environ, "SLOTD_DATABASE_URL": url, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def behind_url(pg_server: LocalPostgres) -> Iterator[str]:
    """A database migrated as far as the previous release went (sql/011; everything
    before sql/013, this release's first): what a deployment has before `slotd migrate`."""
    name = f"slotd_behind_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        create_database(admin, name)
    url = str(pg_server.url(name))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE slotd_schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name_, body in migrations():
            if version < FIRST_OF_THIS_RELEASE:
                conn.execute(body)  # type: ignore[arg-type]
                conn.execute(
                    "INSERT INTO slotd_schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name_),
                )
    yield url


@pytest.fixture
def empty_url(pg_server: LocalPostgres) -> str:
    name = f"slotd_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        create_database(admin, name)
    return str(pg_server.url(name))


def test_version_option_prints_the_one_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"slotd, version {slotd.__version__}"


def test_a_replica_heartbeats_its_version_and_status_shows_the_fleets_versions(
    db_url: str, conn: psycopg.Connection[Any], daemons: list[Daemon]
) -> None:
    daemon = Daemon(db_url, slots=1, env={"SLOTD_HEARTBEAT_INTERVAL": "1s"}).start()
    daemons.append(daemon)
    row = wait_for(
        lambda: conn.execute(
            "SELECT version, migration FROM slotd_replicas WHERE pid = %s", (daemon.pid,)
        ).fetchone(),
        what="the replica's heartbeat",
    )
    assert row == (slotd.__version__, newest_migration())
    # A replica of a release before sql/013 heartbeats without a version.
    conn.execute(
        "INSERT INTO slotd_replicas (replica_id, hostname, pid, slots, task_types)"
        " VALUES ('old-1', 'old-host', 4242, 2, '{rt.noop}')"
    )
    result = CliRunner().invoke(main, ["status"], env={"SLOTD_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    assert f"versions: {slotd.__version__} x1, 0.1.x x1" in result.output
    line = next(x for x in result.output.splitlines() if "old-host" in x)
    assert "0.1.x" in line


def _release_with(tmp: Path, extra: dict[str, str]) -> Path:
    """This checkout's code as a later release carrying `extra` migrations."""
    tree = tmp / "release"
    shutil.copytree(ROOT / "slotd", tree / "slotd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "sql", tree / "sql")
    for name, body in extra.items():
        (tree / "sql" / name).write_text(body)
    return tree


def _migrate_with(tree: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotd", "migrate", *args],
        env={**os.environ, "SLOTD_DATABASE_URL": url, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )


CONTRACT = """-- Removes what replicas before migration 013 still read (a test's contract step).
-- slotd: contract of 013
CREATE TABLE contracted (id int);
"""


def test_migrate_refuses_a_contract_step_while_older_replicas_are_alive(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    later = _release_with(
        tmp_path,
        {"990_expand.sql": "CREATE TABLE expanded (id int);\n", "991_contract.sql": CONTRACT},
    )
    conn.execute(
        "INSERT INTO slotd_replicas (replica_id, hostname, pid, slots, task_types, version,"
        " migration) VALUES ('a', 'old-host', 111, 2, '{t}', NULL, NULL),"
        " ('b', 'mid-host', 222, 2, '{t}', '0.1.9', 12),"
        " ('c', 'new-host', 333, 2, '{t}', '0.2.0', 13),"
        " ('d', 'gone-host', 444, 2, '{t}', NULL, NULL)"
    )
    conn.execute(
        "UPDATE slotd_replicas SET seen_at = now() - interval '2 minutes' WHERE replica_id = 'd'"
    )
    refused = _migrate_with(later, db_url)
    assert refused.returncode == 2, refused.stderr
    message = refused.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "991_contract is a contract step" in message
    assert "old-host:111 (slotd 0.1.x)" in message and "mid-host:222 (slotd 0.1.9)" in message
    assert "new-host" not in message and "gone-host" not in message  # current, and silent
    # The expand step before it was applied; the contract step was not.
    assert "applied 990_expand" in message
    applied = {v for (v,) in conn.execute("SELECT version FROM slotd_schema_migrations")}
    assert 990 in applied and 991 not in applied
    # Once the older replicas are gone it applies; --force applies it regardless.
    conn.execute("DELETE FROM slotd_replicas WHERE replica_id = 'b'")
    assert _migrate_with(later, db_url).returncode == 2
    forced = _migrate_with(later, db_url, "--force")
    assert forced.returncode == 0 and "991_contract" in forced.stdout, forced.stderr


def test_migrate_applies_a_contract_step_when_every_live_replica_carries_its_expand_step(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    later = _release_with(tmp_path, {"991_contract.sql": CONTRACT})
    conn.execute(
        "INSERT INTO slotd_replicas (replica_id, hostname, pid, slots, task_types, version,"
        " migration) VALUES ('c', 'new-host', 333, 2, '{t}', '0.2.0', 13)"
    )
    result = _migrate_with(later, db_url)
    assert result.returncode == 0, result.stderr
    assert "991_contract" in result.stdout


def test_only_a_header_line_makes_a_contract_step() -> None:
    assert upgrades._contract_of(CONTRACT) == 13
    body = "-- expand\nALTER TABLE t ADD COLUMN c int;\n-- slotd: contract of 013\n"
    assert upgrades._contract_of(body) is None
    assert all(m.contract_of is None for m in upgrades.read(ROOT / "sql")), (
        "this release line only expands: a contract step waits for the next release"
    )


def test_a_replica_on_an_older_schema_refuses_with_one_line(behind_url: str) -> None:
    result = _cli(behind_url, "run", "--app", "tests.apps.runtime:registry")
    assert result.returncode == 2
    lacking = ", ".join(name for v, name, _ in migrations() if v >= FIRST_OF_THIS_RELEASE)
    assert result.stderr.strip().splitlines() == [
        f"slotd: the database's slotd schema lacks {lacking}: run slotd migrate"
    ]


@pytest.mark.parametrize("command", [["status"], ["status", "--json"]])
def test_commands_on_an_older_schema_say_run_slotd_migrate(
    behind_url: str, command: list[str]
) -> None:
    result = CliRunner().invoke(main, command, env={"SLOTD_DATABASE_URL": behind_url})
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("slotd: the database's slotd schema is missing or older")
    assert line.endswith(": run slotd migrate")


@pytest.mark.parametrize(
    "command", [["status"], ["dead", "list"], ["cleanup"], ["schedules"], ["cancel", "--id", "1"]]
)
def test_commands_on_an_unmigrated_database_say_run_slotd_migrate(
    empty_url: str, command: list[str]
) -> None:
    result = CliRunner().invoke(main, command, env={"SLOTD_DATABASE_URL": empty_url})
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "run slotd migrate" in line and "Traceback" not in result.output


def test_enqueue_on_an_unmigrated_database_says_run_slotd_migrate(empty_url: str) -> None:
    with psycopg.connect(empty_url) as conn:
        with pytest.raises(SchemaNotMigrated, match=r"\): run slotd migrate$") as caught:
            slotd.enqueue(conn, "rt.noop")
        assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)
