"""Who runs next: priorities as a bounded head start, and fleet-wide concurrency limits
enforced in the claim. Real `slotd run` daemons, real kill -9, the handlers' own records
and samples of the table itself."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import slotd
from slotd.registry import Registry
from slotd.repository import Repository
from tests.apps.limits import RUNS
from tests.daemon import Daemon, wait_for

APP = "tests.apps.limits:registry"


def start(daemons: list[Daemon], db_url: str, **kw: Any) -> Daemon:
    daemon = Daemon(db_url, app=APP, **kw)
    daemons.append(daemon)
    return daemon.start()


@pytest.fixture
def rconn(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(RUNS)
    return conn


def max_overlap(intervals: Iterable[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t)."""
    intervals = list(intervals)
    events = sorted(
        [(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals],
        key=lambda e: (e[0], e[1]),
    )
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def runs(conn: psycopg.Connection[Any], task_type: str) -> list[dict[str, Any]]:
    cur = conn.execute(
        "SELECT task_id, task_group, attempt, pid, started_at,"
        " coalesce(ended_at, lease_ends_at) AS until, ended_at IS NOT NULL AS finished,"
        " lease_ends_at"
        " FROM runs WHERE task_type = %s ORDER BY started_at",
        (task_type,),
    )
    names = [c.name for c in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def remaining(conn: psycopg.Connection[Any], task_type: str) -> int:
    row = conn.execute("SELECT count(*) FROM slotd_tasks WHERE task_type = %s", (task_type,))
    return int(row.fetchone()[0])  # type: ignore[index]


class LeaseSampler(threading.Thread):
    """Counts live leases of one type (per group) on its own connection, as fast as it can."""

    def __init__(self, db_url: str, task_type: str) -> None:
        super().__init__(daemon=True)
        self.db_url, self.task_type = db_url, task_type
        self.most_per_type = self.most_per_group = self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT task_group, count(*) FROM slotd_tasks WHERE task_type = %s"
                    " AND lease_token IS NOT NULL AND lease_expires_at > now()"
                    " GROUP BY task_group",
                    (self.task_type,),
                ).fetchall()
                self.samples += 1
                self.most_per_type = max(self.most_per_type, sum(n for _, n in rows))
                grouped = [n for g, n in rows if g is not None]
                self.most_per_group = max([self.most_per_group, *grouped])

    def __enter__(self) -> LeaseSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(10)


# priorities


def test_priority_orders_by_head_start_and_every_rewrite_keeps_it(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = Registry()
    reg.register("p", lambda t, c: None, ceiling=timedelta(seconds=30))
    low = slotd.enqueue(conn, "p", priority=-100)
    plain = slotd.enqueue(conn, "p")
    urgent = slotd.enqueue(conn, "p", priority=100)
    assert repo.discover(["p"]) == [urgent, plain, low]
    conn.execute("UPDATE slotd_tasks SET run_at = run_at - interval '101 s',"
                 " order_at = order_at - interval '101 s' WHERE id = %s", (low,))  # fmt: skip

    def head_starts() -> dict[int, float]:
        rows = conn.execute(
            "SELECT id, extract(epoch FROM run_at - order_at)::float8 FROM slotd_tasks"
        ).fetchall()
        return {task_id: round(lead, 3) for task_id, lead in rows}

    assert head_starts() == {low: -100.0, plain: 0.0, urgent: 100.0}
    assert repo.discover(["p"]) == [urgent, low, plain]  # low has waited out its 100 s
    claimed = repo.claim([urgent], reg)
    assert claimed is not None
    repo.record_failure(claimed.id, claimed.token, "boom")  # backoff moves run_at
    assert head_starts()[urgent] == 100.0
    assert repo.discover(["p"]) == [low, plain]  # urgent backs off, its head start kept
    for bad in (101, -101, 1.5, True, "9"):
        with pytest.raises(ValueError, match="priority must be a whole number"):
            slotd.enqueue(conn, "p", priority=bad)  # type: ignore[arg-type]


def test_priority_zero_runs_within_its_bound_under_a_stream_of_priority_100(
    rconn: psycopg.Connection[Any],
    db_url: str,
    daemons: list[Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Strict priorities would hold the priority-0 task back for as long as the stream
    lasts. Here the stream outlasts it: only tasks that became due within 100 x step of it
    (plus one discovery window of candidates) may go first."""
    step = 0.02  # 100 points = 2 s of head start, so the test is short
    monkeypatch.setenv("SLOTD_PRIORITY_STEP", "20ms")
    start(daemons, db_url, slots=2, env={"SLOTD_PRIORITY_STEP": "20ms"})
    urgent = ("lim.free", {"sleep": 0.02}, None, None, 100)
    # A backlog well past the candidate windows (2 slots x 40): with only ~100 queued, the
    # start's timing could leave fewer than a window ahead of the waiting task when it was
    # enqueued, and a slot that discovered it then claims it from that window (the bound
    # below allows it): it ran after 1.4 s with 20-25 newer tasks first instead of ~3.2 s
    # with ~195 (1 run in 12 here, once in CI). 300 leave >= 200 ahead whatever the start.
    slotd.enqueue_many(rconn, [urgent] * 300)
    stop = threading.Event()

    def stream() -> None:  # ~100 urgent tasks a second: more than two slots drain
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.wait(0.05):
                slotd.enqueue_many(conn, [urgent] * 5)

    producer = threading.Thread(target=stream, daemon=True)
    producer.start()
    try:
        wait_for(lambda: len(runs(rconn, "lim.free")) >= 20, what="the fleet to be busy")
        (waiting, due_at), = rconn.execute(
            "SELECT %s::bigint, run_at FROM slotd_tasks WHERE id = %s",
            [slotd.enqueue(rconn, "lim.free", {"sleep": 0.02})] * 2,
        ).fetchall()  # fmt: skip
        ran = wait_for(
            lambda: rconn.execute(
                "SELECT started_at FROM runs WHERE task_id = %s", (waiting,)
            ).fetchone(),
            timeout=90,
            what="the priority-0 task to run",
        )
        backlog = remaining(rconn, "lim.free")
    finally:
        stop.set()
        producer.join(10)
    assert backlog > 0, "the stream must outlast the wait, or the test proves nothing"
    started = ran[0]
    wait = (started - due_at).total_seconds()
    window = timedelta(seconds=100 * step)
    first = rconn.execute(
        "SELECT count(*) FILTER (WHERE run_at > %(due)s),"
        "       count(*) FILTER (WHERE run_at > %(due)s + %(window)s),"
        "       count(*)"
        " FROM runs WHERE started_at < %(started)s AND started_at >= %(due)s",
        {"due": due_at, "window": window, "started": started},
    ).fetchone()
    assert first is not None
    newer, late, all_first = first
    rate = all_first / wait if wait else 0.0
    print(
        f"\npriority-0 waited {wait:.2f}s (head-start window {window.total_seconds():g}s) "
        f"under a stream of priority-100 at ~100/s; {all_first} ran meanwhile ({rate:.0f}/s), "
        f"{newer} of them due after it, {late} due more than the window after it"
    )
    # Priorities act: urgent work that became due after it, within the window, went first.
    assert newer > 20
    # And the bound holds: a task due more than the window later goes first only from a
    # discovery that already held the waiting task (each slot's batch: 20 x slots
    # candidates, rotated per slot), never for as long as the stream lasts.
    assert late <= 2 * 20 * 2, (late, wait)


# fleet-wide limits


def test_claims_racing_for_the_last_place_cannot_both_win(db_url: str) -> None:
    """Two claims of a max_running=1 type at once: the second waits for the first's
    transaction and then sees its lease, even though its own statement began before."""
    reg = Registry()
    reg.register("one", lambda t, c: None, ceiling=timedelta(seconds=30), max_running=1)
    with (
        psycopg.connect(db_url, autocommit=True) as setup,
        psycopg.connect(db_url) as first_conn,
        psycopg.connect(db_url, autocommit=True) as second_conn,
    ):
        slotd.enqueue_many(setup, [("one", {})] * 2)
        first, second = Repository(first_conn), Repository(second_conn)
        ids = first.discover(["one"], limits=reg.concurrency_limits)
        assert len(ids) == 2 and second.discover(["one"], limits=reg.concurrency_limits) == ids
        assert first.claim(ids, reg) is not None  # inside first_conn's open transaction
        result: list[Any] = []
        racer = threading.Thread(target=lambda: result.append(second.claim(ids[::-1], reg)))
        racer.start()
        wait_for(
            lambda: setup.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'advisory'"
            ).fetchone(),
            what="the second claim to wait on the limit's lock",
        )
        first_conn.commit()
        racer.join(10)
        assert result == [None]  # the other row was free to lock, but the place was taken
        live = setup.execute(
            "SELECT count(*) FROM slotd_tasks WHERE lease_token IS NOT NULL"
        ).fetchone()
        assert live == (1,)


def test_a_head_of_blocked_tasks_is_passed_over_without_burning_attempts(
    conn: psycopg.Connection[Any], repo: Repository
) -> None:
    reg = Registry()
    reg.register("one", lambda t, c: None, ceiling=timedelta(seconds=30), max_running=1)
    reg.register("grouped", lambda t, c: None, ceiling=timedelta(seconds=30),
                 max_running_per_group=1)  # fmt: skip
    reg.register("free", lambda t, c: None, ceiling=timedelta(seconds=30))
    blocked = slotd.enqueue_many(conn, [("one", {})] * 1000)
    org1 = slotd.enqueue_many(conn, [slotd.NewTask("grouped", group="org:1")] * 3)
    org2 = slotd.enqueue(conn, "grouped", group="org:2")
    behind = slotd.enqueue(conn, "free")
    running = repo.claim(repo.discover(reg.types, limits=reg.concurrency_limits), reg)
    assert running is not None and running.id == blocked[0]
    assert repo.claim([org1[0]], reg) is not None
    # Discovery passes over the 999 the limit holds and the rest of org:1.
    found = repo.discover(reg.types, limit=10, limits=reg.concurrency_limits)
    assert found == [org2, behind]
    # A claim handed blocked candidates takes none of them, and counts no attempt.
    assert repo.claim([*blocked[1:5], org1[1]], reg) is None
    attempts = conn.execute(
        "SELECT max(attempt_count) FROM slotd_tasks WHERE id <> ALL(%s)",
        ([running.id, org1[0]],),
    ).fetchone()
    assert attempts == (0,)
    # The gauge of work waiting on the fleet leaves out work waiting on its own limit.
    conn.execute("UPDATE slotd_tasks SET run_at = run_at - interval '1 hour',"
                 " order_at = order_at - interval '1 hour' WHERE id = ANY(%s)",
                 (blocked[1:],))  # fmt: skip
    assert repo.gauges(reg.concurrency_limits)["oldest_due_seconds"] < 600
    assert repo.gauges()["oldest_due_seconds"] >= 3600
    # The settlement that frees the place claims the next blocked task in the same statement.
    nxt = repo.dequeue_and_claim(running.id, running.token, blocked[1:3], reg)
    assert nxt is not None and nxt.id == blocked[1]


def _in_flight(rconn: psycopg.Connection[Any], fleet: list[Daemon], long: list[int]) -> Any:
    """(replica, task id) of a holding run that started a moment ago, so most of its ~1.4 s
    is still ahead: the replica is killed under it (a short run, or one about to end, could
    be settled before the kill lands on a loaded machine)."""
    for daemon in fleet:
        pids = [p.pid for p in daemon.tree()]
        row = rconn.execute(
            "SELECT task_id FROM runs WHERE ended_at IS NULL AND pid = ANY(%s)"
            " AND task_id = ANY(%s) AND started_at > clock_timestamp() - interval '0.6 s'"
            " LIMIT 1",
            (pids, long),
        ).fetchone()
        if row:
            return daemon, row
    return None


def test_max_running_2_holds_across_3_replicas_of_4_slots_through_a_kill_9(
    rconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    total = int(os.environ.get("SLOTD_TEST_LIMIT_TASKS", "600"))
    fleet = [start(daemons, db_url, slots=4) for _ in range(3)]
    # Mostly short tasks; every 50th holds its place until just before its deadline, so
    # the replica killed below has one in flight with time to spare.
    items = [("lim.two", {"sleep": 0.005, "hold": n % 50 == 0}) for n in range(total)]
    with LeaseSampler(db_url, "lim.two") as sampler:
        long = slotd.enqueue_many(rconn, items)[::50]
        wait_for(lambda: len(runs(rconn, "lim.two")) >= total // 3, timeout=120,
                 what="a third of the tasks to start")  # fmt: skip
        victim, orphan = wait_for(lambda: _in_flight(rconn, fleet, long), timeout=60,
                                  what="a long task in flight")  # fmt: skip
        os.killpg(victim.pid, signal.SIGKILL)  # supervisor and slots; runners follow them
        victim.wait(10)
        wait_for(lambda: remaining(rconn, "lim.two") == 0, timeout=240,
                 what="the queue to drain")  # fmt: skip
    done = runs(rconn, "lim.two")
    finished = {r["task_id"] for r in done if r["finished"]}
    assert len(finished) == total  # every task ran to the end, the orphan's on a retry
    orphan_runs = [r for r in done if r["task_id"] == orphan[0]]
    # Its replica died holding the lease (whether or not the runner got to finish the
    # handler): nobody settled it, so it ran again, but only once the lease had lapsed.
    assert len(orphan_runs) == 2, orphan_runs
    assert orphan_runs[1]["started_at"] >= orphan_runs[0]["lease_ends_at"]
    # The handlers' own records: a killed run holds its place until its lease ends.
    assert max_overlap((r["started_at"], r["until"]) for r in done) == 2
    assert sampler.most_per_type == 2 and sampler.samples > 100
    print(f"\n{total} tasks, {sampler.samples} lease samples, at most {sampler.most_per_type}")


def test_max_running_per_group_1_never_overlaps_a_group(
    rconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    for _ in range(2):
        start(daemons, db_url, slots=3)
    items = [
        slotd.NewTask("lim.group", {"sleep": 0.02}, group=f"org:{n % 4}") for n in range(240)
    ] + [slotd.NewTask("lim.group", {"sleep": 0.02}) for _ in range(20)]
    with LeaseSampler(db_url, "lim.group") as sampler:
        slotd.enqueue_many(rconn, items)
        wait_for(lambda: remaining(rconn, "lim.group") == 0, timeout=120,
                 what="the queue to drain")  # fmt: skip
    done = runs(rconn, "lim.group")
    assert len(done) == len(items)
    for group in (f"org:{n}" for n in range(4)):
        spans = [(r["started_at"], r["until"]) for r in done if r["task_group"] == group]
        assert len(spans) == 60 and max_overlap(spans) == 1, group
    assert sampler.most_per_group == 1
    # Different groups (and tasks without a group) did run side by side.
    assert max_overlap((r["started_at"], r["until"]) for r in done) >= 2


def test_status_and_metrics_show_running_over_limit_and_no_starvation_for_it(
    rconn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    import json
    import urllib.request

    from click.testing import CliRunner

    from slotd.cli import main

    daemon = start(daemons, db_url, slots=3, env={"SLOTD_METRICS_ADDR": "127.0.0.1:0"})
    url = daemon.wait_line(r"metrics on ").split("metrics on ")[1].strip()
    ids = slotd.enqueue_many(rconn, [("lim.one", {"sleep": 30})] * 5)
    rconn.execute("UPDATE slotd_tasks SET run_at = run_at - interval '1 hour',"
                  " order_at = order_at - interval '1 hour' WHERE id = ANY(%s)",
                  (ids,))  # fmt: skip
    wait_for(lambda: runs(rconn, "lim.one"), what="one to start")

    def scrape() -> dict[str, float]:
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        return {
            ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
            for ln in body.splitlines()
            if ln and not ln.startswith("#")
        }

    metrics = wait_for(
        lambda: (m := scrape()).get('slotd_tasks_running{task_type="lim.one"}') == 1 and m,
        what="the running gauge",
    )
    assert metrics['slotd_task_type_limit{task_type="lim.one"}'] == 1
    assert metrics['slotd_task_group_limit{task_type="lim.group"}'] == 1
    # Four tasks due for an hour, waiting only on their own limit: not starvation.
    assert metrics["slotd_task_oldest_due_seconds"] < 60
    env = {"SLOTD_DATABASE_URL": db_url, "SLOTD_DATABASE_URL_READ": None}
    wait_for(lambda: Repository(rconn).replicas(), what="the replica's heartbeat")
    shown = CliRunner().invoke(main, ["status"], env=env)
    assert shown.exit_code == 0, shown.output
    line = next(ln for ln in shown.output.splitlines() if ln.startswith("lim.one"))
    # SCHEDULED, PENDING, RUNNING: each task counted once (the running one is not pending).
    assert line.split()[1:4] == ["0", "4", "1/1"], line
    report = json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).output)
    assert report["limits"]["lim.one"] == {"max_running": 1, "max_running_per_group": None}
    assert report["running"] == {"lim.one": 1} and report["oldest_due_seconds"] < 60
    assert report["oldest_due_by_type"]["lim.one"] >= 3600  # per type, the truth
