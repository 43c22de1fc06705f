"""The docs' fan-out / fan-in example (docs/how-to/fan-out.md) as its users run it: the page
shows the file as it is, `slotd run` drains it, and the script started as the page says
prints the published album; the batch's report counts every resize and the publish."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import psycopg

import slotd
from slotd.repository.batches import batch_of
from tests.daemon import ROOT, Daemon, wait_for

APP = "examples.fan_out.workflow:registry"


def test_the_docs_show_the_example_file_as_it_is() -> None:
    readme = (ROOT / "docs/how-to/fan-out.md").read_text()
    example = (ROOT / "examples/fan_out/workflow.py").read_text()
    assert f"```python\n{example}```" in readme
    commands = re.findall(r"^(slotd run --app \S+|python -m \S+ 7)", readme, re.M)
    assert f"slotd run --app {APP}" in commands
    assert "python -m examples.fan_out.workflow 7" in commands


def test_the_fan_out_example_publishes_then_reports_through_slotd_run(
    conn: psycopg.Connection[Any], db_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(db_url, slots=2, app=APP)
    daemons.append(daemon)
    daemon.start()
    env = {**os.environ, "SLOTD_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "examples.fan_out.workflow", "7"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    found = re.fullmatch(r"batch (\d+), publish task (\d+)", first)
    assert found, first
    batch_id = int(found.group(1))
    urls = [f"https://cdn.example/{i}.webp" for i in range(1, 6)]
    assert "state='succeeded'" in second and str(urls) in second

    def completed() -> Any:
        state = batch_of(conn, batch_id)
        return state if state and state.callback_id else None

    report = wait_for(completed, timeout=90, what="the batch to complete").callback_id
    got = slotd.wait_result(conn, report, timeout=90)
    assert got.value == {
        "album": 7,
        "id": batch_id,
        "succeeded": 6,
        "failed": 0,
        "cancelled": 0,
        "expired": 0,
    }
