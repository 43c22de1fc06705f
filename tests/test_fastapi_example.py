"""The FastAPI + SQLAlchemy example (examples/fastapi_app) as its users run it: requests
through a real HTTP client, the task drained by a real `slotd run`."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.daemon import Daemon, wait_for

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("sqlalchemy", minversion="2.0")
pytest.importorskip("greenlet")


def test_signup_is_welcomed_by_slotd_run(
    db_url: str, daemons: list[Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from examples.fastapi_app.app import app

    monkeypatch.setenv("DATABASE_URL", db_url)
    with TestClient(app) as client:
        made = client.post("/signups", json={"email": "ada@example.com"})
        assert made.status_code == 201, made.text
        signup = made.json()
        # A second signup of the same address fails inside the request's transaction:
        # no second task either.
        assert client.post("/signups", json={"email": "ada@example.com"}).status_code == 409
        with psycopg.connect(db_url) as conn:
            queued = conn.execute("SELECT id, task_type, payload FROM slotd_tasks").fetchall()
        assert queued == [(signup["task_id"], "send_welcome", {"signup_id": signup["id"]})]
        assert client.get(f"/signups/{signup['id']}").json()["welcomed_at"] is None

        daemon = Daemon(
            db_url, app="examples.fastapi_app.tasks:registry", env={"DATABASE_URL": db_url}
        )
        daemons.append(daemon.start())

        def welcomed() -> Any:
            return client.get(f"/signups/{signup['id']}").json()["welcomed_at"]

        wait_for(welcomed, timeout=60, what="the worker to welcome the signup")
        daemon.wait_line(r"send_welcome#\d+ attempt 1: success")
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM slotd_tasks").fetchone() == (0,)
