"""The example's one table, and the database URL both halves read."""

from __future__ import annotations

import os
from datetime import datetime

from sqlalchemy import DateTime, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def database_url() -> str:
    """DATABASE_URL (postgresql://...), which `slotd run` reads too, as SQLAlchemy's psycopg
    URL (postgresql+psycopg://...)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("set DATABASE_URL=postgresql://... (run `slotd migrate` on it first)")
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if scheme in ("postgres", "postgresql") else url


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "signups"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    welcomed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
