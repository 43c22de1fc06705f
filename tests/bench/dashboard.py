"""The dashboard's pages on a 1,000,000-row queue: load time over HTTP, and every statement
each page runs with its time and plan.

    python tests/bench/dashboard.py [--rows 1000000] [--runs 10] [--append]

The table is gauges_cost.py's long-lived mix (60% dead letters, 33% in the future, the rest
due, a hundred leased, 12 skewed types), VACUUMed. Pages are fetched from a real `slotd
dashboard` (uvicorn, HTTP on loopback); the statements are counted and timed in-process
through the same page functions. --append adds the figures to tests/bench/RESULTS.md."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import DashboardReads, Repository, migrate, statements  # noqa: E402
from slotd.repository import history as record  # noqa: E402
from slotd.web import charts, listings, pages  # noqa: E402
from tests.bench.gauges_cost import build  # noqa: E402

PAGES = [
    "/",
    "/running",
    "/dead",
    "/dead?type=type_3",
    "/dead?q=KEY",
    "/dead?after=DEEP",  # page 3,000 of the dead letters, by keyset
    "/dead?error=boom",  # every dead letter's error line starts so: the first 100 match
    "/dead?error=KeyError",  # none does: the search walks its whole stretch of 10,000
    "/tasks",
    "/tasks?type=type_3&after=TASKS",
    "/tasks/ID",
    "/tasks/LONG",  # 10,000 attempts remembered and 10,000 steps: one page of each
    "/tasks/LONG?attempts_before=OLDER&steps_from=9950",  # their last pages
    "/tasks?state=retrying",  # a state search: the newest 10,000 rows walked
    "/tasks?state=failed&type=type_3",
    "/tasks?tag=TAG",  # a tag of 100 tasks, by its GIN index
    "/tasks?state=succeeded",  # 10,000 kept successes
    "/schedules",
    "/types/type_3",
    "/?window=day",
]
# The pages that update themselves (static/dashboard.js), and how often by default: a page
# shown in any number of tabs reads at most once per half interval (app.Dashboard.read_live).
LIVE = ("/", "/running", "/?window=day")  # and every /tasks/<id>, /types/<type>
REFRESH_S = 5.0


class Counting:
    """A connection that records each statement it runs, by its name in sql/."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.names = {sql: name for name, sql in statements().items()}
        self.log: list[tuple[str, float, str, Any]] = []

    def execute(self, sql: Any, params: Any = None) -> Any:
        started = time.perf_counter()
        cur = self.conn.execute(sql, params)
        elapsed = (time.perf_counter() - started) * 1000
        self.log.append((self.names.get(sql, "?"), elapsed, sql, params))
        return cur

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def page_call(path: str) -> Any:
    route, _, query = path.partition("?")
    if route == "/":
        if "window=day" in query:
            return lambda r: pages.overview(r, charts.DAY)
        return pages.overview
    if route.startswith("/types/"):
        return lambda r: pages.task_type(r, route.rsplit("/", 1)[1])
    if route == "/running":
        return lambda r: pages.running(r, timedelta(seconds=30))
    arg = dict(p.split("=", 1) for p in query.split("&")) if query else {}
    if route.startswith("/tasks/"):
        before = int(arg["attempts_before"]) if "attempts_before" in arg else None
        steps_from = int(arg.get("steps_from", 0))
        return lambda r: pages.task(r, int(route.rsplit("/", 1)[1]), before, steps_from)
    if route in ("/dead", "/tasks"):
        search = listings.Search(
            arg.get("type"), arg.get("q"), arg.get("error"), arg.get("state"),
            unquote(arg["tag"]) if "tag" in arg else None,
        )  # fmt: skip
        after = listings.parse_cursor(unquote(arg["after"])) if "after" in arg else None
        listing = listings.dead if route == "/dead" else listings.tasks
        return lambda r: listing(r, search, after)
    return pages.schedules


def percentile(samples: list[float], p: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * p))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--append", action="store_true", help="append to tests/bench/RESULTS.md")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="slotd-bench-dash-"))
    root.chmod(0o711)
    server = LocalPostgres(root=root / "pg", socket_dir=root / "sock", port=5434, fast=True)
    server.start()
    out: list[str] = []
    web = None
    try:
        url = server.url()
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            started = time.perf_counter()
            counts = build(conn, args.rows)
            conn.execute("UPDATE slotd_tasks SET key = 'org:' || id WHERE id % 1000 = 0")
            long_id, older = long_task(conn)
            conn.execute("VACUUM (ANALYZE) slotd_tasks")
            conn.execute("VACUUM (ANALYZE) slotd_attempts")
            conn.execute("VACUUM (ANALYZE) slotd_results")
            built = time.perf_counter() - started
            dead_row = conn.execute(
                "SELECT id, key FROM slotd_tasks WHERE key IS NOT NULL "
                "AND attempt_count >= max_attempts ORDER BY id LIMIT 1"
            ).fetchone()
            assert dead_row is not None
            task_id, key = dead_row
            deep = conn.execute(
                "SELECT coalesce(cancelled_at, last_attempted_at), id FROM slotd_tasks "
                "WHERE attempt_count >= max_attempts "
                "ORDER BY coalesce(cancelled_at, last_attempted_at) DESC NULLS LAST, id DESC "
                "OFFSET %s LIMIT 1",
                (args.rows * 3 // 10,),
            ).fetchone()
            later = conn.execute(
                "SELECT run_at, id FROM slotd_tasks WHERE task_type = 'type_3' "
                "AND attempt_count < max_attempts ORDER BY run_at, id OFFSET %s LIMIT 1",
                (args.rows // 50,),
            ).fetchone()
            assert deep is not None and later is not None
            sampled = time.perf_counter()
            written = record.sample_history(Repository(conn))
            sample_ms = (time.perf_counter() - sampled) * 1000
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        cursors = {
            "DEEP": quote(listings.cursor_text(*deep)),
            "TASKS": quote(listings.cursor_text(*later)),
        }
        paths = []
        for path in PAGES:
            path = path.replace("KEY", key).replace("/ID", f"/{task_id}")
            path = path.replace("LONG", str(long_id)).replace("OLDER", str(older))
            path = path.replace("TAG", quote("tenant:7"))
            for name, value in cursors.items():
                path = path.replace(f"={name}", f"={value}")
            paths.append(path)
        out.append(
            f"- {args.rows:,} rows ({counts}), built and VACUUMed in {built:.0f} s; "
            f"PostgreSQL {version}; {args.runs} loads per page after one warm-up; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        out.append(
            f"- the fleet's backlog sample (history_sample, once a minute for the fleet): "
            f"{sample_ms:.0f} ms, {written} rows"
        )

        port = free_port()
        env = {**os.environ, "SLOTD_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
        web = subprocess.Popen(
            [sys.executable, "-m", "slotd", "dashboard", "--addr", f"127.0.0.1:{port}"],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not reachable(port):
            if time.monotonic() > deadline or web.poll() is not None:
                raise SystemExit("the dashboard did not start")
            time.sleep(0.1)

        out.append("")
        out.append(
            f"| page | median ms | p95 ms | statements (name: ms) | live: statements/s per "
            f"page shown (refresh {REFRESH_S:g}s, one read per {REFRESH_S / 2:g}s) |"
        )
        out.append("|---|---|---|---|---|")
        with psycopg.connect(url, autocommit=True) as conn:
            plans: list[str] = []
            for path in paths:
                fetch(base + path)  # warm-up
                samples = []
                for _ in range(args.runs):
                    started = time.perf_counter()
                    fetch(base + path)
                    samples.append((time.perf_counter() - started) * 1000)
                counting = Counting(conn)
                page_call(path)(DashboardReads(counting))  # type: ignore[arg-type]
                listed = ", ".join(f"{name}: {ms:.1f}" for name, ms, _, _ in counting.log)
                shown = path.replace(key, "<key>").replace(f"/tasks/{long_id}", "/tasks/<long>")
                shown = shown.replace(f"/tasks/{task_id}", "/tasks/<id>")
                shown = shown.replace(f"={older}", "=<older>")
                for name, value in cursors.items():
                    shown = shown.replace(value, f"<{name.lower()} cursor>")
                live = path in LIVE or path.startswith(("/tasks/", "/types/"))
                # dash_bound, the transaction's first statement, is counted too.
                per_s = f"{(len(counting.log) + 1) / (REFRESH_S / 2):.1f}" if live else "–"
                out.append(
                    f"| `{shown}` | {statistics.median(samples):.1f} | "
                    f"{percentile(samples, 0.95):.1f} | {len(counting.log)}: {listed} | {per_s} |"
                )
                for name, _, sql, params in counting.log:
                    plan = conn.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}", params).fetchall()
                    plans.append(f"-- {shown} {name}\n" + "\n".join(r[0] for r in plan))
        print("\n".join(out))
        print("\n\n".join(plans))
        if args.append:
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
            with (ROOT / "tests" / "bench" / "RESULTS.md").open("a") as results:
                results.write(
                    f"\n## {stamp} — `python tests/bench/dashboard.py --rows {args.rows} "
                    f"--runs {args.runs}`\n\nDashboard page loads over HTTP from `slotd "
                    "dashboard` (uvicorn, loopback, no auth) and the statements each page runs "
                    "(timed in-process, one execution each).\n\n" + "\n".join(out) + "\n"
                )
    finally:
        if web is not None:
            web.terminate()
            web.wait(10)
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def long_task(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """A task with 10,000 attempts remembered and 10,000 steps; tags on one row in 100
    (100 rows a tag); 10,000 kept successes. Returns the task's id and the attempt row id
    that opens its attempts' last page."""
    long_id = conn.execute(
        "INSERT INTO slotd_tasks (task_type, attempt_count, max_attempts, run_at, steps) "
        "SELECT 'type_3', 10000, 20000, now() + interval '1 hour', "
        "jsonb_agg(jsonb_build_object('name', 'step ' || g, 'value', repeat('x', 200), "
        "'at', now()) ORDER BY g) FROM generate_series(1, 10000) g RETURNING id"
    ).fetchone()[0]  # type: ignore[index]
    conn.execute(
        "INSERT INTO slotd_attempts (task_id, task_type, number, outcome, error, started_at, "
        "ended_at, host, pid, slot) SELECT %s, 'type_3', g, 'failure', "
        "'Traceback (most recent call last):' || repeat(E'\n  File \"x.py\", line 1', 20) "
        "|| E'\nValueError: try ' || g, now(), now(), 'host', 1, 0 "
        "FROM generate_series(1, 10000) g",
        (long_id,),
    )
    older = conn.execute(
        "SELECT id FROM slotd_attempts WHERE task_id = %s ORDER BY id OFFSET 20 LIMIT 1",
        (long_id,),
    ).fetchone()[0]  # type: ignore[index]
    conn.execute(
        "UPDATE slotd_tasks SET tags = ARRAY['tenant:' || (id / 100 % 100)] WHERE id % 100 = 0"
    )
    conn.execute(
        "INSERT INTO slotd_results (task_id, task_type, value, succeeded_at, expires_at) "
        "SELECT m.id + g, 'type_' || g % 12, NULL, now(), now() + interval '1 day' "
        "FROM generate_series(1, 10000) g, (SELECT max(id) AS id FROM slotd_tasks) m"
    )
    return int(long_id), int(older)


def fetch(url: str) -> None:
    with urllib.request.urlopen(url, timeout=30) as reply:
        reply.read()
        assert reply.status == 200, (url, reply.status)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    main()
