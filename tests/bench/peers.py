"""The peers' side of the benchmark, run with a bench venv's Python (the peers are not slotd
dependencies and never enter its environment): procrastinate and pgqueuer from
tests/bench/.work/venv, oban (oban-py, Python >= 3.12) from tests/bench/.work/venv-oban.
Every import of a peer is inside the function that uses it, so this file runs on either.

    peers.py install SYSTEM DSN                          the peer's own schema installation
    peers.py work SYSTEM DSN OUTDIR [KEY=VALUE ...]     runs until SIGTERM
    peers.py bulk SYSTEM DSN N                           one transaction; prints its commit
                                                         time, exits when stdin closes
    peers.py paced SYSTEM DSN N RATE                     one transaction per task

SYSTEM is procrastinate, pgqueuer or oban. Workers use each library's own run loop and knobs:
procrastinate concurrency=C; pgqueuer batch_size=B, max_concurrent_tasks=C (0 = library
default); oban queues={"default": C}, set up as its `oban start` CLI does (uvloop, orjson,
its default pool, its telemetry logger at INFO), every other option at its default. A
payload carrying "t" makes the handler record handler-start minus t."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import sys
import time
from typing import Any

ROOT_ENV = "BENCH_PEER_OUT"


def _record(t: float | None) -> None:
    if t is None:
        return
    with open(os.path.join(os.environ[ROOT_ENV], f"lat-{os.getpid()}.txt"), "a") as f:
        f.write(f"{time.time() - t:.6f}\n")


def _procrastinate_app(dsn: str, pool: int) -> Any:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool)
    )

    @app.task(name="noop")
    async def noop(i: int | None = None, t: float | None = None) -> None:
        _record(t)

    return app


async def _pgq_queries(dsn: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer import Queries
    from pgqueuer.db import AsyncpgDriver

    conn = await asyncpg.connect(dsn)
    return conn, Queries(AsyncpgDriver(conn))


@functools.cache
def _oban_noop() -> Any:
    """oban's class worker (it needs job.args). Worker and producer both build it here, so
    the worker name stored in each row resolves from oban's registry in the worker."""
    from oban import worker

    @worker(queue="default")
    class Noop:
        async def process(self, job: Any) -> None:
            _record(job.args.get("t"))

    return Noop


async def _oban_client(dsn: str) -> tuple[Any, Any]:
    from oban import Oban

    pool = await Oban.create_pool(dsn, min_size=1, max_size=1)
    return pool, Oban(pool=pool)  # no queues: client mode, as a web app enqueues


def install(system: str, dsn: str) -> None:
    if system == "procrastinate":
        import procrastinate

        app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
        with app.open():
            app.schema_manager.apply_schema()
        return

    async def go() -> None:
        if system == "oban":
            from oban.schema import install as install_oban

            pool, _ = await _oban_client(dsn)
            await install_oban(pool)
            await pool.close()
            return
        conn, queries = await _pgq_queries(dsn)
        await queries.install()
        await conn.close()

    asyncio.run(go())


def _work_oban(dsn: str, conc: int) -> None:
    """What `oban start --queues default:C` runs, minus its banner and cron-module scan."""
    import orjson
    import uvloop
    from oban import Oban
    from oban.telemetry import logger as telemetry_logger
    from psycopg.types.json import set_json_dumps, set_json_loads

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s")
    set_json_dumps(orjson.dumps)
    set_json_loads(orjson.loads)
    _oban_noop()

    async def run() -> None:
        pool = await Oban.create_pool(dsn)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        telemetry_logger.attach()
        try:
            async with Oban(pool=pool, queues={"default": conc}):
                print("ready", flush=True)
                await stop.wait()
        finally:
            telemetry_logger.detach()
            await pool.close()

    uvloop.run(run())


def work(system: str, dsn: str, knobs: dict[str, int]) -> None:
    conc = knobs.get("conc", 4)
    if system == "oban":
        _work_oban(dsn, conc)
        return
    if system == "procrastinate":
        app = _procrastinate_app(dsn, conc + 2)

        async def run_p() -> None:
            async with app.open_async():
                print("ready", flush=True)
                await app.run_worker_async(concurrency=conc, wait=True)

        asyncio.run(run_p())
        return

    async def run_q() -> None:
        import asyncpg
        from pgqueuer import PgQueuer
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            body = json.loads(job.payload) if job.payload else {}
            _record(body.get("t"))

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
        print("ready", flush=True)
        kwargs: dict[str, int] = {}
        if knobs.get("batch"):
            kwargs["batch_size"] = knobs["batch"]
        if knobs.get("conc"):
            kwargs["max_concurrent_tasks"] = knobs["conc"]
        await pgq.run(**kwargs)

    asyncio.run(run_q())


def bulk(system: str, dsn: str, n: int) -> None:
    async def hold() -> None:
        # The connection stays open until the bench has read the server's CPU: its backend's
        # share is the producer's, not the workers'.
        print(f"committed {time.time():.6f}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    async def go() -> None:
        if system == "procrastinate":
            app = _procrastinate_app(dsn, 2)
            async with app.open_async():
                await app.tasks["noop"].batch_defer_async(*({"i": i} for i in range(n)))
                await hold()
            return
        if system == "oban":
            pool, oban = await _oban_client(dsn)
            noop = _oban_noop()
            async with pool.connection() as conn, conn.transaction():
                await oban.enqueue_many((noop.new({"i": i}) for i in range(n)), conn=conn)
            await hold()
            await pool.close()
            return
        conn, queries = await _pgq_queries(dsn)
        await queries.enqueue(["noop"] * n, [b"{}"] * n, [0] * n)
        await hold()
        await conn.close()

    asyncio.run(go())


def paced(system: str, dsn: str, n: int, rate: float) -> None:
    async def go() -> None:
        app = conn = queries = pool = oban = None
        if system == "procrastinate":
            app = _procrastinate_app(dsn, 2)
            await app.open_async()
        elif system == "oban":
            pool, oban = await _oban_client(dsn)
        else:
            conn, queries = await _pgq_queries(dsn)
        start = time.time() + 0.1
        for i in range(n):
            pause = start + i / rate - time.time()
            if pause > 0:
                await asyncio.sleep(pause)
            t = time.time()
            if app is not None:
                await app.tasks["noop"].defer_async(t=t)
            elif oban is not None:
                await oban.enqueue(_oban_noop().new({"t": t}))
            else:
                await queries.enqueue("noop", json.dumps({"t": t}).encode())
        if app is not None:
            await app.close_async()
        elif pool is not None:
            await pool.close()
        else:
            await conn.close()

    asyncio.run(go())


def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "install":
        install(argv[1], argv[2])
    elif cmd == "work":
        os.environ[ROOT_ENV] = argv[3]
        knobs = {k: int(v) for k, v in (a.split("=", 1) for a in argv[4:])}
        work(argv[1], argv[2], knobs)
    elif cmd == "bulk":
        bulk(argv[1], argv[2], int(argv[3]))
    elif cmd == "paced":
        paced(argv[1], argv[2], int(argv[3]), float(argv[4]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
