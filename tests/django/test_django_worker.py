"""End to end: `slotd run --app slotd.contrib.django.worker:registry` runs Django tasks in
its runner processes (django.setup() there), with results and signals as in the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

import slotd

pytest.importorskip("django", minversion="6.0")

from django.tasks import TaskResultStatus  # noqa: E402

TESTS = Path(__file__).resolve().parent.parent


def test_slotd_run_executes_django_tasks(django_db_url: str) -> None:
    from django_project.shop.tasks import add, async_double, async_where, explode, fail_until

    summed, doubled, failed = add.enqueue(20, 22), async_double.enqueue(4), explode.enqueue("x")
    where = async_where.enqueue()
    retried = fail_until.enqueue("W-1", 2)  # fails on its first attempt, then succeeds
    # No SLOTD_DATABASE_URL: the worker takes Django's DATABASES entry.
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("SLOTD_DATABASE_URL", "DATABASE_URL")},
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "SLOTD_BACKOFF_BASE": "1s",
        "SLOTD_BACKOFF_CAP": "1s",
    }
    cmd = [
        sys.executable,
        "-m",
        "slotd",
        "run",
        "--app",
        "slotd.contrib.django.worker:registry",
        "--slots",
        "2",
        "--metrics-addr",
        "off",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = [
                add.get_result(summed.id),
                async_double.get_result(doubled.id),
                explode.get_result(failed.id),
                async_where.get_result(where.id),
                fail_until.get_result(retried.id),
            ]
            done = (states[0], states[1], states[3], states[4])
            if all(s.status == TaskResultStatus.SUCCESSFUL for s in done) and (
                states[2].attempts == 3 and states[2].status == TaskResultStatus.FAILED
            ):
                break
            try:  # waits for the daemon (an early exit ends the wait), not for time
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        first, second, third, fourth, fifth = states
        # The async task ran on the runner's own event loop, not on a thread of its own.
        assert fourth.return_value == "MainThread"
        assert first.return_value == {"sum": 42, "parts": [20, 22]}
        assert second.return_value == 8
        assert third.status == TaskResultStatus.FAILED and third.attempts == 3, third
        assert len(set(first.worker_ids + second.worker_ids)) >= 1
        assert all(":" in w for w in first.worker_ids)
        # #37 item 4: errors and worker_ids are slotd's attempts (sql/030), as slotd.result
        # and `slotd result` show them: one error per failed attempt, with its traceback,
        # and each attempt's worker (host:pid:slot).
        with psycopg.connect(django_db_url, autocommit=True) as conn:
            for shown, n_errors in ((fifth, 1), (third, 3)):
                [(task_id,)] = conn.execute(
                    "SELECT task_id FROM slotd_django_results WHERE id = %s", (shown.id,)
                ).fetchall()
                ran = slotd.result(conn, task_id).attempts  # type: ignore[union-attr]
                assert shown.worker_ids == [a.worker for a in ran]
                assert all(w.count(":") == 2 for w in shown.worker_ids), shown.worker_ids
                assert len(shown.errors) == n_errors == len([a for a in ran if a.error])
        assert fifth.return_value == "ok after 2" and fifth.attempts == 2
        [error] = fifth.errors
        assert error.exception_class is RuntimeError
        assert "RuntimeError: call 1 of W-1 fails" in error.traceback
        assert [e.exception_class for e in third.errors] == [ValueError] * 3
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_priority_10_runs_ahead_of_priority_0(django_db_url: str) -> None:
    """Django's priority is slotd's head start: with one slot, the priority-10 task enqueued
    last is the first to run."""
    from django_project.shop.models import Call
    from django_project.shop.tasks import add

    plain = [add.enqueue(0, n) for n in range(5)]
    urgent = add.using(priority=10).enqueue(10, 10)
    env = {
        **os.environ,
        "SLOTD_DATABASE_URL": django_db_url,
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "slotd", "run", "--app", "slotd.contrib.django.worker:registry",
           "--slots", "1", "--metrics-addr", "off"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while Call.objects.filter(task="add").count() < 6 and time.monotonic() < deadline:
            try:  # waits for the daemon (an early exit ends the wait), not for time
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        order = list(Call.objects.filter(task="add").order_by("id").values_list("arg", flat=True))
        assert order[0] == "10+10", order
        assert sorted(order[1:]) == sorted(f"0+{n}" for n in range(5))
        assert add.get_result(urgent.id).status == TaskResultStatus.SUCCESSFUL
        assert all(add.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in plain)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_sigterm_cancels_an_async_django_task_at_its_await(django_db_url: str) -> None:
    import psycopg
    from django_project.shop.models import Call
    from django_project.shop.tasks import async_wait_forever

    from tests.daemon import Daemon, wait_for

    async_wait_forever.enqueue()
    env = {
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        "SLOTD_SHUTDOWN_GRACE": "30s",
    }
    daemon = Daemon(django_db_url, slots=1, app="slotd.contrib.django.worker:registry", env=env)
    try:
        daemon.start()
        wait_for(lambda: Call.objects.filter(arg="start").exists(), what="the task to start")
        began = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
        # Cancelled at its await on the runner's loop, not killed when the 30 s grace ended.
        assert time.monotonic() - began < 30
        assert Call.objects.filter(task="async_wait_forever", arg="cancelled").count() == 1
        leased = "SELECT count(*) FROM slotd_tasks WHERE lease_token IS NOT NULL"
        with psycopg.connect(django_db_url, autocommit=True) as conn:
            assert conn.execute(leased).fetchone() == (0,)  # released for another worker
    finally:
        daemon.close()
