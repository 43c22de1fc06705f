"""`slotd examples produce`: a steady trickle of the example application's tasks."""

from __future__ import annotations

import re
import time
from typing import Any

import click

from slotd import db
from slotd.config import Settings
from slotd.producer.enqueue import enqueue

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|m|h))?\s*$")
_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(_ctx: Any, _param: Any, value: str) -> float:
    """`2/s`, `30/m`, `100/h`, or a bare number per second; returns tasks per second."""
    match = _RATE.match(value)
    if not match or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{value!r}: write it like 2/s, 30/m or 100/h")
    return float(match.group(1)) / _PER[match.group(2) or "s"]


def register(group: click.Group) -> None:
    group.add_command(examples)


@click.group()
def examples() -> None:
    """The example application (slotd.examples:registry)."""


@examples.command()
@click.option("--rate", default="2/s", show_default=True, callback=parse_rate,
              help="how fast to enqueue: 2/s, 30/m, 100/h")  # fmt: skip
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="stop after this many tasks (default: until interrupted)")  # fmt: skip
@click.option("--type", "types", multiple=True,
              help="only these example types (repeatable), e.g. --type example.plain")  # fmt: skip
@click.pass_context
def produce(ctx: click.Context, rate: float, count: int | None, types: tuple[str, ...]) -> None:
    """Enqueue a steady trickle of example tasks, each committed at once.

    Run the daemon on them with `slotd run --app slotd.examples:registry`."""
    from slotd.examples import registry, sample

    unknown = [t for t in types if t not in registry]
    if unknown:
        raise click.BadParameter(
            f"unknown example type {', '.join(unknown)}; there are {', '.join(registry.types)}",
            param_hint="--type",
        )
    settings: Settings = ctx.obj
    url = db.primary_url(settings)
    click.echo(
        f"producing {rate:g}/s example tasks"
        f"{f' ({count})' if count else ''} into {db.redact(url)}; Ctrl-C stops",
        err=True,
    )
    produced, n = 0, 0
    started = time.monotonic()
    with db.connect(url, role="slotd examples produce") as conn:
        try:
            while count is None or produced < count:
                task_type, payload, max_attempts = sample(n)
                n += 1
                if types and task_type not in types:
                    continue
                # Paced against the start, not the previous enqueue, so a slow
                # round trip does not lower the rate.
                wait = started + produced / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                task_id = enqueue(conn, task_type, payload, max_attempts=max_attempts)
                produced += 1
                click.echo(f"enqueued {task_type}#{task_id}")
        except KeyboardInterrupt:
            pass
    click.echo(f"produced {produced} tasks", err=True)


@examples.command()
@click.option("--rate", default="2/s", show_default=True, callback=parse_rate,
              help="how fast the producer enqueues")  # fmt: skip
@click.option("--slots", type=click.IntRange(min=1), default=None, help="slot processes (4)")
@click.pass_context
def demo(ctx: click.Context, rate: float, slots: int | None) -> None:
    """The example application end to end: a producer in the background and the daemon
    in the foreground (Ctrl-C stops both). With no SLOTD_DATABASE_URL it all runs on the
    embedded development database."""
    import subprocess
    import sys

    from slotd.commands.run import run

    settings: Settings = ctx.obj
    db.primary_url(settings)  # create and start the embedded server once, before both use it
    producer = subprocess.Popen(
        [sys.executable, "-m", "slotd", "examples", "produce", "--rate", f"{rate}/s"],
        stdout=subprocess.DEVNULL,
    )
    try:
        ctx.invoke(run, app="slotd.examples:registry", slots=slots, metrics_addr=None)
    finally:
        producer.terminate()
        producer.wait(10)
