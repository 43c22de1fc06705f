"""A project as `django-admin startproject` makes it, with only what the README says to add
(#42): PostgreSQL in DATABASES, the app in INSTALLED_APPS, slotd's backend in TASKS, and no
slotd setting or environment variable at all. `manage.py migrate` (its system checks,
Django's own apps and slotd's tables), an enqueue in `transaction.atomic()` and
`manage.py slotd run`, which runs the task; the result in Django's admin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", minversion="6.0")

from psycopg.conninfo import conninfo_to_dict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
SETTINGS = """
# Added to startproject's settings, as slotd's README says (nothing else of slotd's):
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", {db}}}}}
INSTALLED_APPS += ["slotd.contrib.django"]
TASKS = {{"default": {{"BACKEND": "slotd.contrib.django.SlotdBackend"}}}}
"""
TASKS_PY = """from django.tasks import task


@task
def greet(name):
    return f"hello {name}"
"""
ENQUEUE = """
from django.db import transaction
from mysite.tasks import greet
with transaction.atomic():
    print(greet.enqueue("ann").id)
"""

ADMIN = """
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
call_command("makemigrations", "slotd", "--check", "--dry-run", verbosity=0)
client = Client()
client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
listing = client.get("/admin/slotd/result/")
detail = client.get("/admin/slotd/result/{id}/change/")
print(listing.status_code, detail.status_code, "mysite.tasks.greet" in listing.text)
print(detail.text)
"""


def test_a_fresh_startproject_with_only_the_documented_settings(
    pg_server: Any, tmp_path: Path
) -> None:
    name = f"fresh_{os.getpid()}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    url = pg_server.url(name)
    # The project's environment: nothing of slotd's, nothing of this suite's.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLOTD_", "DJANGO_")) and k != "DATABASE_URL"
    }
    env["PYTHONPATH"] = str(ROOT)  # slotd itself, as `pip install slotd[django]` would
    made = subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    parts = conninfo_to_dict(url)
    entry = {"NAME": parts["dbname"], "HOST": parts.get("host", ""), "PORT": parts.get("port", "")}
    entry["USER"] = parts.get("user", "")
    db = ", ".join(f"{k!r}: {v!r}" for k, v in entry.items())
    with open(tmp_path / "mysite" / "settings.py", "a") as settings:
        settings.write(SETTINGS.format(db=db))
    (tmp_path / "mysite" / "tasks.py").write_text(TASKS_PY)
    env["SLOTD_METRICS_ADDR"] = "off"  # the suite's ports; the default works as well

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(tmp_path / "manage.py"), *args]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (args, done.stderr)
        return done

    manage("migrate", "--verbosity", "0")  # runs the system checks first
    # Django 6's shell first says what it imported automatically: the id is the last line.
    result_id = manage("shell", "-c", ENQUEUE).stdout.strip().splitlines()[-1]

    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "manage.py"), "slotd", "run", "--slots", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    read = "SELECT status, return_value FROM slotd_django_results WHERE id = %s"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while (row := conn.execute(read, (result_id,)).fetchone())[0] != "SUCCESSFUL":  # type: ignore[index]
                assert time.monotonic() < deadline, "the worker never ran the task"
                try:  # waits for the worker (an early exit ends the wait), not for time
                    proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert row == ("SUCCESSFUL", "hello ann")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err
    # Django's admin (startproject installs it) lists the result and shows, read-only,
    # what get_result says and slotd's attempts; slotd's app has no pending migration.
    shown = manage("shell", "-c", ADMIN.format(id=result_id)).stdout.strip().splitlines()
    first = next(i for i, line in enumerate(shown) if line.startswith("200 "))
    assert shown[first] == "200 200 True", shown
    page = "\n".join(shown[first + 1 :])
    assert "SUCCESSFUL (attempts 1, errors: none, workers: " in page
    assert "<td>success</td>" in page and "hello ann" in page
    # startproject's DEBUG = True: Django's console handler printed each of the task's log
    # lines beside slotd's own (#42 item 8); once now.
    assert err.count(f"id={result_id} path=mysite.tasks.greet state=SUCCESSFUL") == 1, err
