"""The web half: `uvicorn examples.fastapi_app.app:app`.

A signup and the task that welcomes it are written in one AsyncSession transaction: if the
request fails before the commit, neither exists; once it commits, the task will run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from examples.fastapi_app.models import Base, Signup, database_url
from examples.fastapi_app.tasks import Welcome, send_welcome


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = create_async_engine(database_url())
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    yield
    await engine.dispose()


app = FastAPI(title="slotd example", lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    async with app.state.sessions() as s:
        yield s


DB = Annotated[AsyncSession, Depends(session)]


class SignupIn(BaseModel):
    email: str


@app.post("/signups", status_code=201)
async def create_signup(body: SignupIn, db: DB) -> dict[str, Any]:
    signup = Signup(email=body.email)
    db.add(signup)
    try:
        await db.flush()  # the id, and the unique check, before the task names it
    except IntegrityError:
        await db.rollback()
        raise HTTPException(409, f"{body.email} has already signed up") from None
    # The typed handle: its name and payload model in one place, checked before writing.
    task_id = await send_welcome.enqueue_async(
        db, Welcome(signup_id=signup.id), key=f"welcome:{signup.id}"
    )
    await db.commit()  # the signup and its task, together
    return {"id": signup.id, "task_id": task_id}


@app.get("/signups/{signup_id}")
async def read_signup(signup_id: int, db: DB) -> dict[str, Any]:
    signup = await db.get(Signup, signup_id)
    if signup is None:
        raise HTTPException(404, "no such signup")
    welcomed = signup.welcomed_at.isoformat() if signup.welcomed_at else None
    return {"id": signup.id, "email": signup.email, "welcomed_at": welcomed}
