"""Fan-out / fan-in: resize every image of an album in parallel, publish the album once all
of them succeeded (reading their results), and report when the whole batch has ended.

    slotd run --app examples.fan_out.workflow:registry     # one shell: the workers
    python -m examples.fan_out.workflow 7                  # another: start album 7
"""

import os
import sys
from datetime import timedelta

import psycopg

import slotd

registry = slotd.Registry()
DAY = timedelta(days=1)


@registry.handler("album.resize", ceiling=timedelta(minutes=1))
def resize(task: slotd.Task, ctx: slotd.Context) -> dict:
    image = task.payload["image"]
    return {"image": image, "url": f"https://cdn.example/{image}.webp"}


@registry.handler("album.publish", ceiling=timedelta(minutes=1), keep_result=DAY)
def publish(task: slotd.Task, ctx: slotd.Context) -> dict:
    # {resize task id: its return value}, one per parent, delivered with the claim.
    urls = [value["url"] for _, value in sorted(task.parent_results.items())]
    return {"album": task.payload["album"], "urls": urls}


@registry.handler("album.report", ceiling=timedelta(minutes=1), keep_result=DAY)
def report(task: slotd.Task, ctx: slotd.Context) -> dict:
    counts = task.payload["batch"]  # id, succeeded, failed, cancelled, expired
    return {"album": task.payload["album"], **counts}


def start(conn: psycopg.Connection, album: int, images: list[int]) -> tuple[int, int]:
    """One transaction: the batch, its resizes and the publish that waits on them."""
    with slotd.batch(conn, on_complete=("album.report", {"album": album})) as b:
        resized = b.enqueue_many([("album.resize", {"image": i}) for i in images])
        published = b.enqueue("album.publish", {"album": album}, after=resized)
    return b.id, published


if __name__ == "__main__":
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        batch_id, published = start(conn, int(sys.argv[1]), [1, 2, 3, 4, 5])
        print(f"batch {batch_id}, publish task {published}")
        print(slotd.wait_result(conn, published, timeout=60))
