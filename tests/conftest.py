"""One real PostgreSQL per test run, started here; a fresh database per test, cloned from a
migrated template so isolation costs a CREATE DATABASE, not a migration."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotd.localpg import LocalPostgres
from slotd.repository import Repository, migrate

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[LocalPostgres]:
    root = Path(tempfile.mkdtemp(prefix="slotd-test-"))
    root.chmod(0o711)  # as root, the server's own user must be able to pass through
    server = LocalPostgres(root=root / "pg", socket_dir=root / "sock", fast=True)
    server.start()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE slotd_template")
    with psycopg.connect(server.url("slotd_template"), autocommit=True) as conn:
        migrate(conn)
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def db_url(pg_server: LocalPostgres) -> str:
    name = f"t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE slotd_template")  # type: ignore[arg-type]
    return pg_server.url(name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def repo(conn: psycopg.Connection[Any]) -> Repository:
    return Repository(conn)
