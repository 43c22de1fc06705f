#!/usr/bin/env python3
"""slotd adapter for the portable PostgreSQL job-queue benchmark (CONTRIBUTING_ADAPTERS.md).

This process *is* a slotd replica: after its producer and sampler threads start, the main
thread becomes `slotd run` through slotd's own command line entry point, so it is the
supervisor that forks the slot processes and their runners. The harness's SIGKILL of this
pid therefore kills a replica exactly as `kill -9` of `slotd run` does, and its SIGTERM is
slotd's graceful stop.

Threads beside the supervisor (they never fork, and the supervisor never runs their code):
- producer: fixed rate (its own wall-clock credit, or the harness's `ENQUEUE <n>` tokens on
  stdin with PRODUCER_PACING=harness) or depth-target; each batch is `slotd.enqueue` /
  `slotd.enqueue_many` inside a transaction that also records the new ids in
  slotd_bench.enqueued, as an application enqueues inside its own transaction;
- sampler: clock-aligned JSONL every SAMPLE_EVERY_S; pickup percentiles from HDR histograms
  (one per tick, the last 30 s merged), completions from the runners' ledger files
  (slotd_bench_app.py);
- depth (instance 0 only): available rows in slotd_tasks.

stdout carries only JSONL, written with os.write so a fork never inherits a half-written
Python buffer. Everything else goes to stderr."""

from __future__ import annotations

import datetime as dt
import glob
import json
import math
import os
import sys
import threading
import time
from typing import Any
from urllib.parse import urlparse

import psycopg
from hdrh.histogram import HdrHistogram

import slotd

SYSTEM = "slotd"
APP = "slotd_bench_app:registry"
TASK_TYPE = "bench.job"
WINDOW_S = 30.0
OBSERVER_METRICS = frozenset({"queue_depth", "producer_target_rate"})

_sockets: list[psycopg.Connection[Any]] = []


def _blind_in_child() -> None:
    # A slot or runner forked by the supervisor inherits this process's psycopg sockets.
    # Point them at /dev/null (slotd does the same for its own): a libpq object finalised
    # in the child then says goodbye into nothing instead of into our sessions.
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for conn in _sockets:
            try:
                fd = conn.pgconn.socket
            except Exception:  # noqa: BLE001 - closed already
                continue
            if fd >= 0:
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    _sockets.clear()


os.register_at_fork(after_in_child=_blind_in_child)


def env_int(key: str, default: int) -> int:
    value = os.environ.get(key)
    return int(value) if value not in (None, "") else default


def instance_id() -> int:
    return env_int("BENCH_INSTANCE_ID", 0)


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL must be set")
    return url


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def emit(record: dict[str, Any]) -> None:
    record.setdefault("instance_id", instance_id())
    os.write(1, (json.dumps(record) + "\n").encode())


def log(message: str) -> None:
    os.write(2, f"[slotd-bench {instance_id()}] {message}\n".encode())


def connect(autocommit: bool) -> psycopg.Connection[Any]:
    conn = psycopg.connect(database_url(), autocommit=autocommit, connect_timeout=3)
    _sockets.append(conn)
    return conn


def drop(conn: psycopg.Connection[Any] | None) -> None:
    if conn is None:
        return
    try:
        _sockets.remove(conn)
    except ValueError:
        pass
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass


# ─── setup ───────────────────────────────────────────────────────────────


def prepare_database() -> None:
    """`slotd migrate` (the users' path; safe from two replicas at once), then the bench's
    own ledger of enqueued ids. Waits for a database that is not up yet."""
    from slotd.cli import main as slotd_main

    for _ in range(120):
        try:
            # In-process: a restarted replica is serving again without a second interpreter
            # start (the harness counts that time as recovery).
            slotd_main(args=["migrate"], prog_name="slotd", standalone_mode=False)
            break
        except (psycopg.OperationalError, SystemExit) as exc:
            log(f"slotd migrate: {exc}; retrying")
            time.sleep(1)
    else:
        raise SystemExit("slotd migrate kept failing")
    with psycopg.connect(database_url()) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('slotd_bench schema'))")
        conn.execute("CREATE SCHEMA IF NOT EXISTS slotd_bench")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS slotd_bench.enqueued ("
            " task_id bigint PRIMARY KEY, instance int NOT NULL,"
            " at timestamptz NOT NULL DEFAULT now())"
        )


# ─── producer ────────────────────────────────────────────────────────────


class Counters:
    def __init__(self) -> None:
        self.enqueued = 0
        self.target_rate = 0.0
        self.queue_depth = 0


def read_rate(default: int, cache: dict[str, Any]) -> int:
    # The harness's high-load phase rewrites this file; read it at most twice a second.
    path = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
    if not path:
        return default
    now = time.monotonic()
    if now - cache.get("at", -1.0) >= 0.5:
        cache["at"] = now
        try:
            with open(path) as fh:
                cache["rate"] = int(float(fh.read().strip()))
        except (OSError, ValueError):
            cache["rate"] = default
    return int(cache.get("rate", default))


class Producer:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.conn: psycopg.Connection[Any] | None = None
        self.instance = instance_id()
        self.failures = 0

    def enqueue(self, n: int) -> None:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(autocommit=False)
            conn = self.conn
            with conn.transaction():
                stamp = time.time()
                if n == 1:
                    ids = [slotd.enqueue(conn, TASK_TYPE, {"t": stamp})]
                else:
                    ids = slotd.enqueue_many(conn, [(TASK_TYPE, {"t": stamp})] * n)
                conn.execute(
                    "INSERT INTO slotd_bench.enqueued (task_id, instance)"
                    " SELECT unnest(%s::bigint[]), %s",
                    (ids, self.instance),
                )
            self.counters.enqueued += n
            if self.failures:
                log(f"producer: enqueueing again after {self.failures} failed batches")
                self.failures = 0
        except psycopg.Error as exc:
            if self.failures == 0:
                log(f"producer: enqueue failed: {str(exc).strip().splitlines()[0]}")
            self.failures += 1
            drop(self.conn)
            self.conn = None
            time.sleep(0.2)

    def run(self) -> None:
        mode = os.environ.get("PRODUCER_MODE", "fixed")
        pacing = os.environ.get("PRODUCER_PACING", "adapter")
        if mode == "fixed" and pacing == "harness":
            self.from_tokens()
        elif mode == "depth-target":
            self.depth_target()
        else:
            self.fixed_rate()

    def from_tokens(self) -> None:
        self.counters.target_rate = float(env_int("PRODUCER_RATE", 0))
        for line in sys.stdin:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "ENQUEUE":
                self.enqueue(int(parts[1]))

    def depth_target(self) -> None:
        target = env_int("TARGET_DEPTH", 1000)
        batch_max = max(1, env_int("PRODUCER_BATCH_MAX", 128))
        while True:
            remaining = target - self.counters.queue_depth
            if remaining <= 0:
                time.sleep(0.05)
                continue
            self.enqueue(min(batch_max, remaining))

    def fixed_rate(self) -> None:
        # Credit on real elapsed time (the contract's normative pacing), one row per
        # enqueue when PRODUCER_BATCH_MAX <= 1, as the procrastinate adapter does.
        default_rate = env_int("PRODUCER_RATE", 100)
        batch_max = max(1, env_int("PRODUCER_BATCH_MAX", 1))
        period = max(1, env_int("PRODUCER_BATCH_MS", 10)) / 1000.0
        cache: dict[str, Any] = {}
        next_t = time.monotonic()
        credit = 0.0
        last = time.monotonic()
        while True:
            rate = read_rate(default_rate, cache)
            self.counters.target_rate = float(rate)
            if rate <= 0:
                time.sleep(0.1)
                next_t = last = time.monotonic()
                credit = 0.0
                continue
            if batch_max == 1:
                next_t = max(next_t + 1.0 / rate, time.monotonic())
                pause = next_t - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                self.enqueue(1)
                continue
            pause = period - (time.monotonic() - last)
            if pause > 0:
                time.sleep(pause)
            now = time.monotonic()
            credit += rate * (now - last)
            last = now
            whole = min(batch_max, int(credit))
            if whole >= 1:
                credit -= whole
                self.enqueue(whole)


def depth_loop(counters: Counters) -> None:
    conn: psycopg.Connection[Any] | None = None
    while True:
        try:
            if conn is None:
                conn = connect(autocommit=True)
            row = conn.execute(
                "SELECT count(*) FROM slotd_tasks"
                " WHERE task_type = %s AND run_at <= now() AND attempt_count < max_attempts"
                " AND (lease_token IS NULL OR lease_expires_at < now())",
                (TASK_TYPE,),
            ).fetchone()
            counters.queue_depth = int(row[0]) if row else 0
        except psycopg.Error:
            drop(conn)
            conn = None
        time.sleep(0.5)


# ─── sampler ─────────────────────────────────────────────────────────────


class LedgerTail:
    """Reads the lines this replica's runners append (slotd_bench_app.py), from where each
    file stood when this process started: a restarted replica counts only its own."""

    def __init__(self, directory: str, instance: int) -> None:
        self.pattern = os.path.join(directory, f"done-{instance}-*.txt")
        self.offsets: dict[str, int] = {p: os.path.getsize(p) for p in glob.glob(self.pattern)}
        self.partial: dict[str, bytes] = {}

    def read(self) -> list[int]:
        latencies: list[int] = []
        for path in glob.glob(self.pattern):
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except OSError:
                continue
            self.offsets[path] = offset + len(chunk)
            data = self.partial.pop(path, b"") + chunk
            lines = data.split(b"\n")
            if lines[-1]:
                self.partial[path] = lines[-1]
            for line in lines[:-1]:
                fields = line.split()
                if len(fields) == 3:
                    latencies.append(int(fields[2]))
        return latencies


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, 3_600_000_000, 3)  # 1 µs .. 1 h, 3 significant figures


def sampler(counters: Counters, ledger: LedgerTail) -> None:
    every = env_int("SAMPLE_EVERY_S", 5)
    ring: list[HdrHistogram] = []
    ring_len = max(1, math.ceil(WINDOW_S / every))
    observer = instance_id() == 0
    completed = 0
    last_enq, last_cmp = counters.enqueued, 0
    last_tick = time.monotonic()
    while True:
        # Ticks on wall-clock multiples of SAMPLE_EVERY_S, so replicas and systems line up.
        time.sleep(every - (time.time() % every))
        latencies = ledger.read()
        tick = new_histogram()
        for value in latencies:
            tick.record_value(max(1, value))
        completed += len(latencies)
        ring.append(tick)
        del ring[:-ring_len]
        window = new_histogram()
        for h in ring:
            window.add(h)
        now = time.monotonic()
        elapsed = max(0.001, now - last_tick)
        last_tick = now
        enq_rate = (counters.enqueued - last_enq) / elapsed
        cmp_rate = (completed - last_cmp) / elapsed
        last_enq, last_cmp = counters.enqueued, completed
        if window.get_total_count():
            p50, p95, p99 = (window.get_value_at_percentile(p) / 1000.0 for p in (50, 95, 99))
        else:
            p50 = p95 = p99 = 0.0
        stamp = now_iso()
        for metric, value, window_s in (
            ("claim_p50_ms", p50, WINDOW_S),
            ("claim_p95_ms", p95, WINDOW_S),
            ("claim_p99_ms", p99, WINDOW_S),
            ("enqueue_rate", enq_rate, float(every)),
            ("completion_rate", cmp_rate, float(every)),
            ("queue_depth", float(counters.queue_depth), 0.0),
            ("producer_target_rate", counters.target_rate, 0.0),
        ):
            if metric in OBSERVER_METRICS and not observer:
                continue
            emit(
                {
                    "t": stamp,
                    "system": SYSTEM,
                    "kind": "adapter",
                    "subject_kind": "adapter",
                    "subject": "",
                    "metric": metric,
                    "value": value,
                    "window_s": window_s,
                }
            )


# ─── the replica ─────────────────────────────────────────────────────────


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ.setdefault("SLOTD_BENCH_LEDGER", os.path.join(here, "ledger"))
    os.makedirs(os.environ["SLOTD_BENCH_LEDGER"], exist_ok=True)
    # The harness gives SIGTERM 5 s before it escalates; slotd's graceful stop must fit.
    os.environ.setdefault("SLOTD_SHUTDOWN_GRACE", "2s")
    os.environ.setdefault("SLOTD_METRICS_ADDR", "off")  # two replicas on one host
    slots = env_int("WORKER_COUNT", 8)
    db_name = (urlparse(database_url()).path or "/").lstrip("/") or "slotd_bench"
    emit(
        {
            "kind": "descriptor",
            "system": SYSTEM,
            "event_tables": [
                "public.slotd_tasks",
                "public.slotd_replicas",
                "public.slotd_outcomes",
            ],
            "extensions": [],
            "version": getattr(slotd, "__version__", "checkout"),
            "schema_version": "slotd migrate",
            "db_name": db_name,
            "started_at": now_iso(),
        }
    )
    prepare_database()
    counters = Counters()
    ledger = LedgerTail(os.environ["SLOTD_BENCH_LEDGER"], instance_id())
    threads = [
        threading.Thread(target=Producer(counters).run, name="producer", daemon=True),
        threading.Thread(target=sampler, args=(counters, ledger), name="sampler", daemon=True),
    ]
    if instance_id() == 0:
        threads.append(
            threading.Thread(target=depth_loop, args=(counters,), name="depth", daemon=True)
        )
    for thread in threads:
        thread.start()
    log(f"slotd run --slots {slots} (this pid is the supervisor)")
    from slotd.cli import main as slotd_main

    slotd_main(
        args=["run", "--app", APP, "--slots", str(slots)],
        prog_name="slotd",
    )


if __name__ == "__main__":
    main()
