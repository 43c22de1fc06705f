"""The worker half: `slotd run --app examples.fastapi_app.tasks:registry`.

Handlers are plain sync functions on a sync SQLAlchemy engine: each runs in a slot's runner
process, which keeps the engine (and its pool) warm across tasks. `send_welcome` is a typed
handle: its payload is a `Welcome` (a pydantic model, as the web half already uses), checked
when the web half enqueues it and handed to the handler as the model."""

from __future__ import annotations

from datetime import timedelta
from functools import cache

from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, func, update
from sqlalchemy.orm import Session

import slotd
from examples.fastapi_app.models import Signup, database_url

registry = slotd.Registry()


@cache
def engine() -> Engine:
    # Made on first use, in the runner process (never inherited across a fork).
    return create_engine(database_url())


class Welcome(BaseModel):
    signup_id: int


@registry.handler("send_welcome", ceiling=timedelta(seconds=30), payload=Welcome)
def send_welcome(task: slotd.Task[Welcome], ctx: slotd.Context) -> None:
    # A real app would call its mail provider here. Delivery is at least once, so the
    # write is idempotent: only a signup not yet welcomed is stamped.
    with Session(engine()) as db, db.begin():
        db.execute(
            update(Signup)
            .where(Signup.id == task.payload.signup_id, Signup.welcomed_at.is_(None))
            .values(welcomed_at=func.now())
        )
    ctx.log.info("welcomed signup %s", task.payload.signup_id)
