"""An order flow as code (docs: Workflows as code): charge the card, wait for a person's
approval, ship, sleep, remind. Each side effect is a durable step, run once per order
whatever crashes, retries or deploys happen between them; the wait and the sleep free the
worker's slot for days at no cost.

    slotd run --app examples.order_flow.workflow:registry     # one shell: the workers
    python -m examples.order_flow.workflow start 7            # another: order 7
    python -m examples.order_flow.workflow approve 7          # a person approves it

ORDER_REMIND_AFTER (seconds, default 3 days): how long after shipping the reminder goes.
"""

import os
import sys
from datetime import timedelta

import psycopg

import slotd

registry = slotd.Registry()
LOG = "CREATE TABLE IF NOT EXISTS order_log (order_id int, what text, at timestamptz DEFAULT now())"


def _log(order: int, what: str) -> dict:
    """The side effect a real flow would have (a charge, a parcel, an e-mail): a row."""
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(LOG)
        conn.execute("INSERT INTO order_log (order_id, what) VALUES (%s, %s)", (order, what))
    return {"order": order, "done": what}


@registry.handler("order.flow", ceiling=timedelta(minutes=1))
def order_flow(task: slotd.Task, ctx: slotd.Context) -> None:
    order = task.payload["order"]
    ctx.step("charge", _log, order, "charged")
    approval = ctx.wait_event(f"approved:order:{order}", timeout=timedelta(days=3))
    if approval is None:
        ctx.step("refund", _log, order, "refunded")  # nobody approved it in time
        return
    ctx.step("ship", _log, order, f"shipped (approved by {approval['by']})")
    ctx.sleep(timedelta(seconds=float(os.environ.get("ORDER_REMIND_AFTER", 3 * 86400))))
    ctx.step("remind", _log, order, "reminded")


def main(argv: list[str]) -> None:
    verb, order = argv[1], int(argv[2])
    with psycopg.connect(os.environ["SLOTD_DATABASE_URL"]) as conn:  # one transaction
        if verb == "start":
            print(slotd.enqueue(conn, "order.flow", {"order": order}, key=f"order:{order}"))
        else:
            print(
                slotd.emit(conn, f"approved:order:{order}", {"by": os.environ.get("USER", "ann")})
            )


if __name__ == "__main__":
    main(sys.argv)
