"""The daemon as users run it: real processes, real signals, real kill -9, real PostgreSQL."""

from __future__ import annotations

import signal
import time
from typing import Any

import psutil
import psycopg
import pytest

import slotd
from tests.daemon import Daemon, gone, wait_for


def start(daemons: list[Daemon], db_url: str, **kw: Any) -> Daemon:
    daemon = Daemon(db_url, **kw)
    daemons.append(daemon)
    return daemon.start()


def task_row(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    cur = conn.execute("SELECT * FROM slotd_tasks WHERE id = %s", (task_id,))
    found = cur.fetchone()
    return dict(zip([c.name for c in cur.description], found, strict=True)) if found else None


def settled(conn: psycopg.Connection[Any], task_id: int) -> dict[str, Any] | None:
    """The row once a settlement has written it: gone, or unleased with an error."""
    row = task_row(conn, task_id)
    if row is None:
        return {"deleted": True}
    if row["lease_token"] is None and row["last_error"]:
        return row
    return None


def starts(conn: psycopg.Connection[Any], task_id: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT attempt, pid, note, at FROM executions WHERE task_id = %s AND phase = 'start'"
        " ORDER BY at",
        (task_id,),
    ).fetchall()


def test_drains_every_task_exactly_once(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=4)
    ids = slotd.enqueue_many(qconn, [("rt.noop", {"n": n}) for n in range(200)])
    wait_for(
        lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
        what="the queue to drain",
    )
    runs = qconn.execute(
        "SELECT task_id, count(*) FROM executions WHERE phase = 'start' GROUP BY task_id"
    ).fetchall()
    assert sorted(task_id for task_id, _ in runs) == sorted(ids)
    assert {count for _, count in runs} == {1}


KILL_ONLY = {"rt.gil", "rt.grandchild"}


@pytest.mark.parametrize("task_type", ["rt.spin", "rt.sleep", "rt.recv", "rt.gil", "rt.grandchild"])
def test_watchdog_ends_a_handler_that_ignores_its_context(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], task_type: str
) -> None:
    daemon = start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, task_type)
    first = wait_for(lambda: starts(qconn, task_id), what="the handler to start")[0]
    row = wait_for(lambda: settled(qconn, task_id), what="the watchdog's settlement")
    # Settled by the slot as a timeout with backoff, not left to wait out its lease.
    assert row["attempt_count"] == 1
    assert row["run_at"] > row["last_attempted_at"]
    runner_pid = first[1]
    if task_type in KILL_ONLY:
        # Nothing in the handler's frame could run: the runner's process group was killed.
        assert "killed" in row["last_error"]
        assert gone(runner_pid)
    else:
        # Interrupted in its frame at the deadline; the runner itself lives on.
        assert "interrupted at the deadline" in row["last_error"]
        assert not gone(runner_pid)
        assert "slotd: runner 0" in " ".join(psutil.Process(runner_pid).cmdline())
    if task_type == "rt.grandchild":
        grandchild = int(first[2])
        wait_for(
            lambda: gone(grandchild),
            what="the handler's subprocess to be killed with its runner",
        )
    # The one slot serves again: a fresh runner took over.
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: task_row(qconn, follow) is None, what="the slot to serve again")
    assert len(daemon.titled("runner 0")) == 1


@pytest.mark.parametrize("task_type", ["rt.crash", "rt.segv"])
def test_runner_death_is_settled_at_once_as_crashed(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], task_type: str
) -> None:
    start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, task_type)
    row = wait_for(lambda: settled(qconn, task_id), what="the crash settlement")
    assert "runner died" in row["last_error"]
    assert row["attempt_count"] == 1
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: task_row(qconn, follow) is None, what="a fresh runner to serve")


def test_a_task_that_always_kills_its_runner_dead_letters(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=1, env={"SLOTD_BACKOFF_BASE": "10ms", "SLOTD_BACKOFF_CAP": "20ms"})
    task_id = slotd.enqueue(qconn, "rt.crash", max_attempts=3)
    wait_for(
        lambda: (
            (row := task_row(qconn, task_id))
            and row["attempt_count"] == 3
            and row["lease_token"] is None
        ),
        what="the third attempt to be settled",
    )
    assert len(starts(qconn, task_id)) == 3
    assert slotd.repository.Repository(qconn).gauges()["dead"] == {"rt.crash": 1}


def test_no_retry_overlaps_the_attempt_it_replaces(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=2, env={"SLOTD_BACKOFF_BASE": "10ms", "SLOTD_BACKOFF_CAP": "20ms"})
    task_id = slotd.enqueue(qconn, "rt.gil", max_attempts=2)
    runs = wait_for(
        lambda: (r := starts(qconn, task_id)) and len(r) == 2 and r, what="two attempts"
    )
    (_, first_pid, _, first_at), (_, _, _, second_at) = runs
    # The second attempt began only after the first handler's process was gone.
    assert (second_at - first_at).total_seconds() >= 1.0
    assert gone(first_pid)


@pytest.mark.parametrize("task_type", ["rt.sliced", "rt.async_sliced"])
def test_sliced_handler_advances_through_the_runner(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], task_type: str
) -> None:
    start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, task_type, {"cursor": 0})
    wait_for(lambda: task_row(qconn, task_id) is None, what="the sliced task to finish")
    assert [note for _, _, note, _ in starts(qconn, task_id)] == ["0", "1", "2", "3"]


def test_killed_slot_is_restarted_and_its_lease_settled(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=1)
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(lambda: starts(qconn, task_id), what="the handler to start")
    slot = wait_for(lambda: daemon.titled("slot 0 running"), what="the busy slot")[0]
    runner_pid = starts(qconn, task_id)[0][1]
    slot.kill()
    row = wait_for(lambda: settled(qconn, task_id), what="the supervisor's settlement")
    assert "slot died" in row["last_error"]
    wait_for(
        lambda: gone(runner_pid),
        what="the orphaned runner to die",
    )
    follow = slotd.enqueue(qconn, "rt.noop")
    wait_for(lambda: task_row(qconn, follow) is None, what="the restarted slot to serve")


def test_kill_9_of_the_supervisor_leaves_no_orphans_and_releases(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=2)
    task_id = slotd.enqueue(qconn, "rt.polite")
    wait_for(lambda: starts(qconn, task_id), what="the handler to start")
    family = daemon.tree()
    assert len(family) == 4  # two slots, two runners
    daemon.signal(signal.SIGKILL)
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert alive == []
    row = task_row(qconn, task_id)
    assert row["lease_token"] is None  # the slot released it on its way out
    assert row["attempt_count"] == 1


def test_sigterm_cancels_releases_and_exits_within_the_grace(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=3, env={"SLOTD_SHUTDOWN_GRACE": "2s"})
    ids = slotd.enqueue_many(
        qconn, [("rt.polite", {}), ("rt.polite", {}), ("rt.stubborn_long", {})]
    )
    wait_for(lambda: all(starts(qconn, i) for i in ids), what="three handlers running")
    began = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    took = time.monotonic() - began
    assert took < 2 + 0.5 + 5, took  # grace + kill grace + slack for a loaded machine
    rows = [task_row(qconn, i) for i in ids]
    assert all(r is not None and r["lease_token"] is None for r in rows)
    assert all(r["attempt_count"] == 1 for r in rows)  # a rollout refunds nothing
    ends = qconn.execute("SELECT count(*) FROM executions WHERE phase = 'end'").fetchone()
    assert ends == (2,)  # the polite ones saw ctx.cancelled; the stubborn one was killed
    assert daemon.tree() == []


def test_idle_replica_discovers_once_per_tick_not_once_per_slot(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(
        daemons,
        db_url,
        slots=4,
        env={"SLOTD_POLL_INTERVAL": "200ms", "SLOTD_METRICS_ADDR": "127.0.0.1:0"},
    )
    empties = metric_reader(daemon, "slotd_claims_empty_total")
    first, t0 = empties(), time.monotonic()
    wait_for(lambda: time.monotonic() - t0 >= 2.0, what="a two second window")
    second, t1 = empties(), time.monotonic()
    ticks = (t1 - t0) / 0.2
    # One discovery per tick (plus the odd wake): never one per slot.
    assert second - first <= ticks + 3, (second - first, ticks)
    assert second - first >= ticks / 2


def test_sighup_replaces_runners_with_new_code_between_tasks(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], tmp_path: Any
) -> None:
    app = tmp_path / "hupapp.py"
    source = """
import os
from datetime import timedelta
import psycopg, slotd
registry = slotd.Registry()
@registry.handler("hup.version", ceiling=timedelta(seconds=30))
def version(task, ctx):
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as c:
        c.execute("INSERT INTO executions (task_id, attempt, phase, note) "
                  "VALUES (%s, 1, 'start', %s)", (task.id, VERSION))
VERSION = "{version}"
"""
    app.write_text(source.format(version="one"))
    daemon = start(
        daemons,
        db_url,
        slots=2,
        app="hupapp:registry",
        env={"PYTHONPATH": f"{tmp_path}:{daemon_root()}", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    first = slotd.enqueue(qconn, "hup.version")
    wait_for(lambda: starts(qconn, first), what="the old code to run")
    app.write_text(source.format(version="two, new"))
    mark = len(daemon.lines)
    daemon.signal(signal.SIGHUP)
    daemon.wait_line("reload complete", after=mark)
    second = slotd.enqueue(qconn, "hup.version")
    wait_for(lambda: starts(qconn, second), what="the new code to run")
    assert starts(qconn, first)[0][2] == "one"
    assert starts(qconn, second)[0][2] == "two, new"


def daemon_root() -> str:
    from tests.daemon import ROOT

    return str(ROOT)


def test_sighup_with_broken_code_keeps_every_slot_serving_the_old_code(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], tmp_path: Any
) -> None:
    app = tmp_path / "brokenapp.py"
    app.write_text(
        "import os\nfrom datetime import timedelta\nimport psycopg, slotd\n"
        "registry = slotd.Registry()\n"
        "@registry.handler('hup.version', ceiling=timedelta(seconds=30))\n"
        "def version(task, ctx):\n"
        "    with psycopg.connect(os.environ['SLOTD_DATABASE_URL'], autocommit=True) as c:\n"
        '        c.execute("INSERT INTO executions (task_id, attempt, phase, note) "\n'
        "                  \"VALUES (%s, 1, 'start', 'old')\", (task.id,))\n"
    )
    daemon = start(daemons, db_url, slots=2, app="brokenapp:registry",
                   env={"PYTHONPATH": f"{tmp_path}:{daemon_root()}",
                        "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    app.write_text("raise RuntimeError('a broken deploy')\n")
    mark = len(daemon.lines)
    daemon.signal(signal.SIGHUP)
    daemon.wait_line("reload stopped at slot 0", after=mark)
    ids = slotd.enqueue_many(qconn, [("hup.version", {}) for _ in range(4)])
    wait_for(lambda: all(starts(qconn, i) for i in ids), what="the old code to keep serving")
    assert {starts(qconn, i)[0][2] for i in ids} == {"old"}


def test_runner_is_recycled_between_tasks_after_max_tasks(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    start(daemons, db_url, slots=1, env={"SLOTD_RUNNER_MAX_TASKS": "2"})
    ids = [slotd.enqueue(qconn, "rt.noop") for _ in range(6)]
    wait_for(lambda: qconn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,),
             what="six tasks")  # fmt: skip
    pids = [starts(qconn, i)[0][1] for i in ids]
    # Two tasks per runner, each runner a fresh process; none interrupted mid-task.
    assert len(set(pids)) == 3
    assert qconn.execute("SELECT count(*) FROM executions WHERE phase = 'end'").fetchone() == (6,)


def test_discovery_reads_the_replica_and_claims_on_the_primary(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon], scratch_pg: Any
) -> None:
    replica_url = scratch_pg.new_database()  # stands in for a lagging read replica
    daemon = start(
        daemons,
        db_url,
        slots=1,
        env={
            "SLOTD_DATABASE_URL_READ": replica_url,
            "SLOTD_POLL_INTERVAL": "200ms",
            "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        },
    )
    empties = metric_reader(daemon, "slotd_claims_empty_total")
    task_id = slotd.enqueue(qconn, "rt.noop")
    # Not yet "replicated": the NOTIFY and the ticks wake the slot; discovery finds nothing.
    seen = empties()
    wait_for(lambda: empties() >= seen + 3, what="three empty discoveries")
    assert task_row(qconn, task_id) is not None and starts(qconn, task_id) == []
    with psycopg.connect(replica_url, autocommit=True) as replica:
        replica.execute(
            "INSERT INTO slotd_tasks (id, task_type, payload, run_at, max_attempts)"
            " VALUES (%s, 'rt.noop', '{}', now() - interval '1 second', 20)",
            (task_id,),
        )
        # Replicated: the next tick's discovery sees it, the claim takes the primary's row.
        wait_for(lambda: task_row(qconn, task_id) is None, what="the claim on the primary")
        assert len(starts(qconn, task_id)) == 1
        assert replica.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (1,)


def metric_reader(daemon: Daemon, name: str) -> Any:
    import urllib.request

    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()

    def read() -> float:
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        return sum(float(ln.split()[-1]) for ln in body.splitlines() if ln.startswith(name))

    return read


def test_replica_announces_itself_and_leaves_on_sigterm(
    qconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, db_url, slots=3)
    repo = slotd.repository.Repository(qconn)
    seen = wait_for(lambda: repo.replicas(), what="the replica's heartbeat")
    assert [(r["pid"], r["slots"]) for r in seen] == [(daemon.pid, 3)]
    assert "rt.noop" in seen[0]["task_types"]
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert repo.replicas() == []
