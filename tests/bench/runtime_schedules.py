"""What runtime schedules cost at 10,000 (#40): the runtime-schedule thread's CPU and its
lateness, firing, and idle.

    python tests/bench/runtime_schedules.py [--n 10000] [--seconds 60] [--replicas 1]
                                            [--results FILE]

A private PostgreSQL; N schedules put with slotd.put_schedule; the daemon's own thread
(slotd.supervisor.runtime_schedules.RuntimeScheduleThread) run in-process for a window, one
per replica (--replicas R: R threads, each on its own connection, as R `slotd run`s would;
the CPU figures are their sum, and "split" is each one's share of the fires):

1. firing: every= periods spread over 10..59 s, so about N/30 schedules fall due each second
   (each fire enqueues a task, or folds into its previous one still pending: nobody drains
   the queue here). Reported: fires/s, the thread's CPU (thread_time) per second of wall
   time and per fire, and lateness sampled every 100 ms as max(now() - next_fire_at) over
   the due rows (how far behind its fire time the most overdue schedule is).
2. idle: the same N schedules, none due within the window (every=1d): the thread's CPU per
   second. It reads only the due end of the next_fire_at index, so N does not enter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import slotd  # noqa: E402
from slotd.dev.localpg import LocalPostgres  # noqa: E402
from slotd.repository import migrate  # noqa: E402
from slotd.supervisor.runtime_schedules import RuntimeScheduleThread  # noqa: E402

SPREAD = r"""UPDATE slotd_runtime_schedules
SET next_fire_at = now() + random() * substring(expression FROM 'every (\d+)s')::int
                                    * interval '1 second'"""
LATE = "SELECT coalesce(max(extract(epoch FROM now() - next_fire_at)), 0)::float8 FROM slotd_runtime_schedules WHERE next_fire_at <= now()"  # noqa: E501


def put(url: str, n: int, period: callable) -> None:  # type: ignore[valid-type]
    with psycopg.connect(url) as conn:
        for i in range(n):
            slotd.put_schedule(conn, f"s{i:05d}", task_type="bench.noop", every=period(i))
        conn.commit()


def window(url: str, seconds: float, replicas: int) -> dict[str, Any]:
    settings = SimpleNamespace(max_attempts=20, prepare="auto", schema="public")
    threads = [RuntimeScheduleThread(settings, url) for _ in range(replicas)]
    for thread in threads:
        thread.start()
    worst, samples = 0.0, []
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as probe:
        time.sleep(2.0)  # the first pass fires what fell due while the schedules were put
        busy0 = sum(t.busy for t in threads)
        fired0 = [t.fired for t in threads]
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            late = probe.execute(LATE).fetchone()[0]
            samples.append(late)
            worst = max(worst, late)
            time.sleep(0.1)
        wall = time.monotonic() - t0
        busy = sum(t.busy for t in threads) - busy0
        each = [t.fired - f0 for t, f0 in zip(threads, fired0, strict=True)]
    for thread in threads:
        thread.stop()
    fired = sum(each)
    samples.sort()
    return {
        "wall_s": wall,
        "fires_per_s": fired / wall,
        "cpu_ms_per_s": busy * 1000 / wall,
        "cpu_us_per_fire": busy * 1e6 / fired if fired else 0.0,
        "late_p50_ms": samples[len(samples) // 2] * 1000,
        "late_p99_ms": samples[int(len(samples) * 0.99)] * 1000,
        "late_max_ms": worst * 1000,
        "setup_s": t0 - started,
        "split": "/".join(f"{100 * e / fired:.0f}%" for e in each) if fired else "-",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--results", default=str(ROOT / "tests/bench/RESULTS.md"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="slotd-bench-rtsched-"))
    os.chmod(tmp, 0o755)
    pg = LocalPostgres(tmp / "pg", tmp / "sock", port=56_000 + os.getpid() % 4000)
    pg.start()
    pg.wait_ready()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE firing")
            admin.execute("CREATE DATABASE idle")
        out = {}
        for name, period in (
            ("firing", lambda i: timedelta(seconds=10 + i % 50)),
            ("idle", lambda i: timedelta(days=1)),
        ):
            url = str(pg.url(name))
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
            t = time.monotonic()
            put(url, args.n, period)
            print(f"{name}: put {args.n} schedules in {time.monotonic() - t:.1f}s", flush=True)
            if name == "firing":
                # The steady state: each schedule's next fire somewhere within its period
                # from now. Fresh from their put none would fall due for 10 s, and a short
                # window (the smoke's 3 s) would see no fire at all.
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(SPREAD)
            out[name] = window(url, args.seconds, args.replicas)
            print(name, out[name], flush=True)
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    f, i = out["firing"], out["idle"]

    def row(r: dict[str, Any], label: str) -> str:
        late = f"{r['late_p50_ms']:.0f} / {r['late_p99_ms']:.0f} / {r['late_max_ms']:.0f}"
        per_fire = f"{r['cpu_us_per_fire']:.0f}" if r["fires_per_s"] else "-"
        return (
            f"| {label} | {r['fires_per_s']:.0f} | {r['split']} | {r['cpu_ms_per_s']:.2f} "
            f"| {per_fire} | {late} |"
        )

    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = f"""
## Runtime schedules at {args.n:,} (#40) — {stamp}

`python tests/bench/runtime_schedules.py --n {args.n} --seconds {args.seconds:g} \\
--replicas {args.replicas}` (2-core VM shared with other work; {args.replicas} replica(s)'
runtime-schedule threads in-process, each on its own connection, local socket).

| window | fires/s | split | threads' CPU ms per s | CPU µs per fire | late p50 / p99 / max ms |
| --- | ---: | --- | ---: | ---: | ---: |
{row(f, "firing (every 10..59 s)")}
{row(i, "idle (every 1 d, none due)")}

Only due rows are read (an index range on next_fire_at, FOR UPDATE SKIP LOCKED, 500 a
batch), so an idle replica's cost does not grow with N: one `runtime_schedules_next` per
second here (these threads hear no notifications, so they look every POLL); a `slotd run`
whose LISTEN works looks at the soonest fire time, when a put notifies, or every 5 minutes.
Before the window, each schedule's next fire is spread over its period from now (the steady
state). Lateness is sampled every 100 ms as the most overdue due row's age.
"""
    with open(args.results, "a") as results:
        results.write(text)
    print(text)


if __name__ == "__main__":
    main()
