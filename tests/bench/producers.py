"""What each producer path costs per enqueue: psycopg sync and asyncio, and SQLAlchemy 2
Session and AsyncSession on the psycopg driver (which unwrap to the same statement), on a
throwaway server. N single enqueues in one transaction, then one commit; best of 3.

    python tests/bench/producers.py [N]
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

import slotd
from slotd import repository
from slotd.dev import localpg


def sa(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main(n: int) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
    from sqlalchemy.orm import Session

    with localpg.scratch(prefix="slotd-bench-producers-") as server:
        url = str(server.url())
        with psycopg.connect(url, autocommit=True) as conn:
            repository.migrate(conn)
        engine = create_engine(sa(url))

        def psycopg_sync() -> None:
            with psycopg.connect(url) as conn:
                for i in range(n):
                    slotd.enqueue(conn, "bench", {"i": i})

        def sqlalchemy_session() -> None:
            with Session(engine) as session:
                for i in range(n):
                    slotd.enqueue(session, "bench", {"i": i})
                session.commit()

        def run(coro: Callable[[], Awaitable[None]]) -> Callable[[], None]:
            return lambda: asyncio.run(coro())

        async def psycopg_async() -> None:
            async with await psycopg.AsyncConnection.connect(url) as conn:
                for i in range(n):
                    await slotd.enqueue_async(conn, "bench", {"i": i})

        async def sqlalchemy_async_session() -> None:
            aengine = create_async_engine(sa(url))
            async with async_sessionmaker(aengine)() as session:
                for i in range(n):
                    await slotd.enqueue_async(session, "bench", {"i": i})
                await session.commit()
            await aengine.dispose()

        cases = {
            "psycopg Connection": psycopg_sync,
            "psycopg AsyncConnection": run(psycopg_async),
            "SQLAlchemy Session": sqlalchemy_session,
            "SQLAlchemy AsyncSession": run(sqlalchemy_async_session),
        }
        print(f"| producer ({n} enqueues, one transaction) | us/enqueue (best of 3) |")
        print("|---|---|")
        for name, case in cases.items():
            best = min(timed(case) for _ in range(3))
            print(f"| {name} | {best / n * 1e6:.0f} |")
        engine.dispose()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
