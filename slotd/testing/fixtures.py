"""The plugin's fixtures and its marker. slotd.testing imports them into its own namespace,
the plugin module pytest registers, which is where pytest collects them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from slotd.registry import Registry
from slotd.testing.eager import Eager, eager
from slotd.testing.manual import ManualQueue
from slotd.testing.postgres import ThrowawayPostgres, throwaway_postgres

_PROVIDE = (
    "slotd's pytest plugin needs a `{name}` fixture from your conftest.py: {what}. "
    "See the docstring of slotd.testing for an example."
)


@pytest.fixture
def slotd_conn() -> psycopg.Connection[Any]:
    """Override in your conftest: a psycopg 3 connection to a migrated database."""
    pytest.fail(
        _PROVIDE.format(
            name="slotd_conn",
            what="a psycopg 3 connection to a database migrated with `slotd migrate` "
            "(or request `slotd_postgres` for a throwaway server)",
        ),
        pytrace=False,
    )


@pytest.fixture
def slotd_registry() -> Registry:
    """Override in your conftest: the slotd.Registry whose handlers the tests run."""
    pytest.fail(_PROVIDE.format(name="slotd_registry", what="your slotd.Registry"), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slotd_eager(propagate=False): options of the slotd_eager fixture; propagate=True "
        "makes a failing task raise TaskFailed from enqueue",
    )


@pytest.fixture
def slotd_eager(
    request: pytest.FixtureRequest, slotd_registry: Registry, slotd_conn: psycopg.Connection[Any]
) -> Iterator[Eager]:
    """Eager mode for the test: slotd.enqueue runs the task inline. Options come from
    `@pytest.mark.slotd_eager(propagate=True)` or an indirect parameter
    (`@pytest.mark.parametrize("slotd_eager", [{"propagate": True}], indirect=True)`)."""
    marker = request.node.get_closest_marker("slotd_eager")
    options = {**(marker.kwargs if marker else {}), **getattr(request, "param", {})}
    unknown = sorted(set(options) - {"propagate"})
    if unknown:
        pytest.fail(f"slotd_eager takes only propagate=...; got {unknown}", pytrace=False)
    with eager(slotd_registry, slotd_conn, propagate=bool(options.get("propagate"))) as runner:
        yield runner


@pytest.fixture
def task_queue(slotd_conn: psycopg.Connection[Any], slotd_registry: Registry) -> ManualQueue:
    """Manual mode: a ManualQueue on the test's connection and transaction."""
    return ManualQueue(slotd_conn, slotd_registry)


@pytest.fixture(scope="session")
def slotd_postgres() -> Iterator[ThrowawayPostgres]:
    """Opt-in: a throwaway PostgreSQL for the session (needs the server binaries)."""
    with throwaway_postgres() as pg:
        yield pg
