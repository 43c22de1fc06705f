"""slotd where opentelemetry is not installed (plain `pip install slotd`): tests/no_otel on
PYTHONPATH makes every import of it fail in the processes started here, the daemon's forks
included. Middleware still wraps every attempt, nothing of OpenTelemetry is imported, no
trace context is stored, and the test suite's own tracing tests skip instead of failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg

from tests.daemon import ROOT, Daemon, wait_for
from tests.test_middleware import ROOMY, notes_of
from tests.test_runtime import start, task_row

BLOCKED = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "no_otel")])}


def test_without_opentelemetry_middleware_runs_and_nothing_of_it_is_imported_or_stored(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    env = {**ROOMY, **BLOCKED, "SLOTD_LOG_FORMAT": "json"}
    daemon = start(daemons, db_url, slots=1, app="tests.apps.middleware:registry", env=env)
    # The producer side, blocked too: the command line's enqueue.
    command = [sys.executable, "-m", "slotd", "enqueue", "mw.async_value", '{"tenant": "t"}']
    done = subprocess.run(
        command,
        env={**os.environ, **BLOCKED, "SLOTD_DATABASE_URL": db_url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (task_id,) = [int(s) for s in done.stdout.split() if s.isdigit()]
    assert notes_of(qconn, task_id)[:4] == ["outer>", "inner>", "async_outer>", "async_inner>"]
    (row,) = qconn.execute(
        "SELECT note FROM executions WHERE task_id = %s AND phase = 'chain'", (task_id,)
    ).fetchall()
    assert json.loads(row[0])["otel"] is False  # neither opentelemetry nor slotd.tracing
    line = daemon.wait_line(rf"mw.async_value#{task_id} attempt 1: success")
    assert "trace_id" not in json.loads(line)
    wait_for(lambda: task_row(qconn, task_id) is None, what="the success")


def test_the_suites_tracing_tests_skip_and_middleware_tests_pass_without_opentelemetry() -> None:
    selection = [
        "tests/test_tracing.py",
        "tests/test_middleware.py::test_the_test_modes_run_the_same_chain",
        "tests/test_middleware.py::test_a_plain_middleware_after_an_async_one_is_refused_at_registration",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
        env={**os.environ, **BLOCKED},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed, 1 skipped" in done.stdout, done.stdout[-2000:]


FIRST_LOAD_RACE = r"""
import sys
import threading
from importlib.abc import MetaPathFinder

in_import = threading.Event()
release = threading.Event()
asked: list[str] = []


class HeldImport(MetaPathFinder):
    # Holds the first thread inside the failing import of opentelemetry (tests/no_otel
    # makes it fail) until the second thread is inside integrations.tracing() too.
    def find_spec(self, fullname, path, target=None):
        if fullname == "opentelemetry":
            asked.append(threading.current_thread().name)
            in_import.set()
            if threading.current_thread().name == "first":
                release.wait(60)
        return None


sys.meta_path.insert(0, HeldImport())
from slotd import integrations  # noqa: E402

results = {}


def ask():
    try:
        results[threading.current_thread().name] = integrations.tracing()
    except ImportError as exc:
        results[threading.current_thread().name] = repr(exc)


first = threading.Thread(target=ask, name="first")
first.start()
assert in_import.wait(60)
second = threading.Thread(target=ask, name="second")
second.start()


def in_tracing():
    frame = sys._current_frames().get(second.ident)
    while frame is not None:
        if frame.f_code.co_name == "tracing" and frame.f_code.co_filename.endswith(
            "integrations.py"
        ):
            return True
        frame = frame.f_back
    return False


while second.is_alive() and not in_tracing():
    threading.Event().wait(0.001)
release.set()
first.join(60)
second.join(60)
print(repr(results), repr(asked))
"""


def test_the_tracing_integration_asked_by_two_threads_at_once_is_imported_once() -> None:
    # `slotd run` loads the integrations while a thread of the same process enqueues (the
    # public bench's adapter), or a threaded server's first requests enqueue at once: without
    # opentelemetry the second caller got "cannot import name 'tracing' from 'slotd'".
    done = subprocess.run(
        [sys.executable, "-c", FIRST_LOAD_RACE],
        env={**os.environ, **BLOCKED},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["{'first':", "None,", "'second':", "None}", "['first']"]
