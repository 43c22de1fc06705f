"""A Django project with OPTIONS SCHEMA: `manage.py migrate` puts slotd's tables in that
schema (nothing of slotd in public, where Django's own tables are), a task enqueued by
Django is written there and run by `manage.py slotd run`, whose `status` counts it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

TESTS = Path(__file__).resolve().parent.parent
MANAGE = TESTS / "django_project" / "manage.py"

ENQUEUE = """
import django, json
django.setup()
from django_project.shop.tasks import add
from django.utils import timezone
from datetime import timedelta
now = add.enqueue(20, 22)
later = add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
print(json.dumps([now.id, later.id]))
"""


def slotd_objects(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname LIKE 'slotd%%'",
        (schema,),
    ).fetchall()
    return sorted(r[0] for r in rows)


def test_options_schema_holds_the_queue_from_migrate_to_the_worker(pg_server: Any) -> None:
    name = f"django_schema_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    url = str(pg_server.url(name))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLOTD_", "DATABASE_URL"))},
        "SLOTD_DJANGO_TEST_DATABASE_URL": url,
        "SLOTD_DJANGO_TEST_SCHEMA": "shop_jobs",
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }

    def run(*args: str, code: str | None = None) -> str:
        cmd = [sys.executable, "-c", code] if code else [sys.executable, str(MANAGE), *args]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("migrate", "--verbosity", "0")
    with psycopg.connect(url, autocommit=True) as conn:
        assert slotd_objects(conn, "public") == []
        assert "slotd_tasks" in slotd_objects(conn, "shop_jobs")
        assert "slotd_django_results" in slotd_objects(conn, "shop_jobs")
        now_id, later_id = json.loads(run(code=ENQUEUE))
        worker = subprocess.Popen(
            [sys.executable, str(MANAGE), "slotd", "run", "--slots", "1", "--metrics-addr", "off"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            status = (
                'SELECT status, return_value FROM "shop_jobs".slotd_django_results WHERE id = %s'
            )
            deadline = time.monotonic() + 60
            while conn.execute(status, (now_id,)).fetchone()[0] != "SUCCESSFUL":  # type: ignore[index]
                assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
                assert time.monotonic() < deadline, "the worker never ran the task"
                time.sleep(0.1)
            assert conn.execute(status, (now_id,)).fetchone()[1] == {"sum": 42, "parts": [20, 22]}  # type: ignore[index]
            assert conn.execute(status, (later_id,)).fetchone()[0] == "READY"  # type: ignore[index]
            # The handler stores its result before it returns; the slot's settlement removes
            # the queue row a moment later. Stopping the worker before that would release the
            # row at shutdown (run again later: at least once), and the count below would be 2.
            queued = (
                'SELECT count(*) FROM "shop_jobs".slotd_tasks t'
                ' JOIN "shop_jobs".slotd_django_results r ON r.task_id = t.id WHERE r.id = %s'
            )
            while conn.execute(queued, (now_id,)).fetchone()[0]:  # type: ignore[index]
                assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
                assert time.monotonic() < deadline, "the worker never settled the task"
                time.sleep(0.1)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        report = json.loads(run("slotd", "status", "--json"))
        assert report["pending"] == {"django.default": 1}
        assert slotd_objects(conn, "public") == []
