"""The worker half: `slotd run --app examples.fastapi_app.tasks:registry`.

Handlers are plain sync functions on a sync SQLAlchemy engine: each runs in a slot's runner
process, which keeps the engine (and its pool) warm across tasks."""

from __future__ import annotations

from datetime import timedelta
from functools import cache

from sqlalchemy import Engine, create_engine, func, update
from sqlalchemy.orm import Session

import slotd
from examples.fastapi_app.models import Signup, database_url

registry = slotd.Registry()


@cache
def engine() -> Engine:
    # Made on first use, in the runner process (never inherited across a fork).
    return create_engine(database_url())


@registry.handler("send_welcome", ceiling=timedelta(seconds=30))
def send_welcome(task: slotd.Task, ctx: slotd.Context) -> None:
    # A real app would call its mail provider here. Delivery is at least once, so the
    # write is idempotent: only a signup not yet welcomed is stamped.
    with Session(engine()) as db, db.begin():
        db.execute(
            update(Signup)
            .where(Signup.id == task.payload["signup_id"], Signup.welcomed_at.is_(None))
            .values(welcomed_at=func.now())
        )
    ctx.log.info("welcomed signup %s", task.payload["signup_id"])
