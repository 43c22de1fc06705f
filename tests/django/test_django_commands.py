"""`manage.py slotd run | status | prune_results` as a Django project runs them: the worker
takes its database from DATABASES (a socket entry here; TCP entries and OPTIONS are turned
into the same conninfo), with no SLOTD_DATABASE_URL set."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django", minversion="6.0")

from django.db.utils import ConnectionHandler  # noqa: E402
from django.tasks import TaskResultStatus  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from slotd.contrib.django.database import conninfo_for  # noqa: E402

TESTS = Path(__file__).resolve().parent.parent
MANAGE = TESTS / "django_project" / "manage.py"


def wrapper(entry: dict[str, Any]) -> Any:
    handler = ConnectionHandler({"default": {"ENGINE": "django.db.backends.postgresql", **entry}})
    return handler["default"]


def test_a_tcp_entry_with_options_becomes_the_conninfo_django_connects_with() -> None:
    entry = {
        "NAME": "shop",
        "USER": "app",
        "PASSWORD": "s3cret 'quoted'",
        "HOST": "db.internal",
        "PORT": "6432",
        "OPTIONS": {
            "sslmode": "require",
            "connect_timeout": 5,
            "options": "-c search_path=shop",
            "application_name": "shop-web",
            "server_side_binding": True,  # Django's, not libpq's
            "prepare_threshold": None,  # psycopg's
            "isolation_level": 2,
        },
    }
    assert conninfo_to_dict(conninfo_for(wrapper(entry))) == {
        "dbname": "shop",
        "user": "app",
        "password": "s3cret 'quoted'",
        "host": "db.internal",
        "port": "6432",
        "sslmode": "require",
        "connect_timeout": "5",
        "options": "-c search_path=shop",
        "application_name": "shop-web",
        "client_encoding": "UTF8",
    }


def test_a_socket_entry_and_a_service_entry() -> None:
    socket = conninfo_to_dict(conninfo_for(wrapper({"NAME": "shop", "HOST": "/run/postgresql"})))
    assert socket == {"dbname": "shop", "host": "/run/postgresql", "client_encoding": "UTF8"}
    service = conninfo_to_dict(conninfo_for(wrapper({"NAME": "", "OPTIONS": {"service": "shop"}})))
    assert service == {"service": "shop", "client_encoding": "UTF8"}


def manage(*args: str, env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "slotd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kw,
    )


def manage_py(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def project_env(django_db_url: str) -> dict[str, str]:
    """The project's environment: its settings read the suite's database; no slotd URL."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLOTD_DATABASE_URL", "DATABASE_URL")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "django_project.settings",
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
            "SLOTD_METRICS_ADDR": "off",
        }
    )
    return env


def test_manage_py_slotd_run_drains_the_database_in_DATABASES(
    project_env: dict[str, str],
) -> None:
    from django_project.shop.tasks import add

    summed = add.enqueue(40, 2)
    status = manage("status", "--json", env=project_env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pending"] == {"django.default": 1}

    proc = subprocess.Popen(
        [sys.executable, str(MANAGE), "slotd", "run", "--slots", "1"],
        env=project_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while add.get_result(summed.id).status != TaskResultStatus.SUCCESSFUL:
            assert time.monotonic() < deadline, "the worker never ran the task"
            try:  # waits for the worker (an early exit ends the wait), not for time
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert add.get_result(summed.id).return_value == {"sum": 42, "parts": [40, 2]}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err
    assert "embedded" not in err  # never the embedded development database


def test_manage_py_slotd_prune_results_and_bad_usage(
    project_env: dict[str, str], django_db_url: str
) -> None:
    import psycopg
    from django_project.shop.tasks import add

    old = add.enqueue(1, 0)
    with psycopg.connect(django_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE slotd_django_results SET status = 'SUCCESSFUL', finished_at = %s WHERE id = %s",
            (add.get_result(old.id).enqueued_at - timedelta(days=8), old.id),
        )
    pruned = manage("prune_results", env=project_env)
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned 1 task results of TASKS['default'] older than 7 days" in pruned.stdout
    bad = manage("frobnicate", env=project_env)
    assert bad.returncode != 0 and "invalid choice: 'frobnicate'" in bad.stderr


def test_an_explicit_url_naming_another_database_wins_with_a_warning(
    django_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from slotd.commands.run import _database_from_app
    from slotd.config import Settings
    from slotd.contrib.django.worker import build_registry

    reg = build_registry()
    reg.database_url = django_db_url
    assert _database_from_app(Settings(), reg).database_url == django_db_url
    same = Settings(database_url=django_db_url)
    assert _database_from_app(same, reg).database_url == django_db_url
    assert "another database" not in caplog.text
    other = django_db_url.rsplit("/", 1)[0] + "/elsewhere"
    assert _database_from_app(Settings(database_url=other), reg).database_url == other
    assert "names another database than the application's" in caplog.text


def test_an_unmigrated_database_is_reported_by_check_and_refused_by_the_commands(
    project_env: dict[str, str], pg_server: Any
) -> None:
    import psycopg

    name = f"django_empty_{os.getpid()}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")  # type: ignore[arg-type]
        admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    env = {**project_env, "SLOTD_DJANGO_TEST_DATABASE_URL": pg_server.url(name)}
    checked = subprocess.run(
        [sys.executable, str(MANAGE), "check", "--database", "default"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "slotd.W001" in checked.stderr + checked.stdout, checked
    for action in ("run", "status"):
        refused = manage(action, env=env)
        assert refused.returncode == 2, refused
        assert "are not applied to database 'default': run manage.py migrate" in refused.stderr
    # `slotd run --app` says it in Django's words too, not "run slotd migrate" (#42 item 8).
    app = "slotd.contrib.django.worker:registry"
    direct = subprocess.run(
        [sys.executable, "-m", "slotd", "run", "--app", app, "--slots", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert direct.returncode == 2, direct
    assert "run manage.py migrate" in direct.stderr and "slotd migrate" not in direct.stderr


def test_a_database_migrated_under_0_1_gets_the_new_sql_from_manage_py_migrate(
    project_env: dict[str, str], pg_server: Any
) -> None:
    """An existing deployment: slotd 0.1's SQL (001-003) applied and Django's 0001 recorded.
    `manage.py migrate` after the upgrade must bring the rest (0002), or the new claim
    statement meets tables and columns that are not there."""
    import psycopg

    from slotd.repository import migrations

    name = f"django_old_{os.getpid()}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")  # type: ignore[arg-type]
        admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    env = {**project_env, "SLOTD_DJANGO_TEST_DATABASE_URL": pg_server.url(name)}
    faked = manage_py("migrate", "slotd", "0001", "--fake", env=env)
    assert faked.returncode == 0, faked
    old = [(v, n, b) for v, n, b in migrations() if v <= 3]
    with psycopg.connect(pg_server.url(name), autocommit=True) as conn:
        from slotd.repository import statements

        conn.execute(statements()["migrate_init"])  # type: ignore[arg-type]
        for version, migration, body in old:
            conn.execute(body)  # type: ignore[arg-type]
            conn.execute(
                statements()["migrate_record"],  # type: ignore[arg-type]
                {"version": version, "name": migration},
            )
    migrated = manage_py("migrate", env=env)
    assert migrated.returncode == 0, migrated
    with psycopg.connect(pg_server.url(name), autocommit=True) as conn:
        tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables")}
        applied = [row[0] for row in conn.execute(statements()["migrate_applied"])]  # type: ignore[arg-type]
    assert {"slotd_paused_types", "slotd_schedules"} <= tables
    assert sorted(applied) == [v for v, _, _ in migrations()]
