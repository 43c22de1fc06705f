"""One real PostgreSQL per test run, started here; a fresh database per test, cloned from a
migrated template so isolation costs a CREATE DATABASE, not a migration. The same
throwaway server slotd's pytest plugin offers its users (slotd.testing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from slotd.dev.localpg import LocalPostgres
from slotd.repository import Repository
from slotd.testing import ThrowawayPostgres, throwaway_postgres
from tests.daemon import EXECUTIONS, Daemon


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--browser", action="store_true", help="also run the headless-Chromium dashboard tests"
    )
    parser.addoption("--systemd", action="store_true", help="also boot systemd in systemd-nspawn")
    parser.addoption(
        "--fresh-venv",
        action="store_true",
        help="also run the README's test command in a fresh virtualenv (minutes)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: headless Chromium tests (run with --browser)")
    config.addinivalue_line("markers", "systemd: systemd-nspawn boot tests (run with --systemd)")
    config.addinivalue_line(
        "markers", "fresh_venv: the README's full set-up in a fresh virtualenv (--fresh-venv)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Groups of their own (tests/browser/run.sh, tests/systemd/run.sh,
    # tests/fresh_venv/run.sh, from .ci/run): a browser, a booted container, or every extra
    # installed into a new virtualenv, and minutes.
    groups = {
        "browser": "browser tests run with --browser (tests/browser/run.sh)",
        "systemd": "systemd boot tests run with --systemd (tests/systemd/run.sh)",
        "fresh_venv": "the README's test command in a fresh virtualenv runs with --fresh-venv"
        " (tests/fresh_venv/run.sh)",
    }
    for marker, reason in groups.items():
        if config.getoption(f"--{marker.replace('_', '-')}"):
            continue
        for item in items:
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def scratch_pg() -> Iterator[ThrowawayPostgres]:
    with throwaway_postgres() as pg:
        yield pg


@pytest.fixture(scope="session")
def pg_server(scratch_pg: ThrowawayPostgres) -> LocalPostgres:
    return scratch_pg.server


@pytest.fixture
def db_url(scratch_pg: ThrowawayPostgres) -> str:
    return scratch_pg.new_database()


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def repo(conn: psycopg.Connection[Any]) -> Repository:
    return Repository(conn)


@pytest.fixture
def qconn(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """`conn` with the table the runtime test handlers record their runs in."""
    conn.execute(EXECUTIONS)
    return conn


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test starts; each is killed with every process it made, whatever happens."""
    made: list[Daemon] = []
    yield made
    for daemon in made:
        daemon.close()
