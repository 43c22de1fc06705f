"""The plans of the queue's hot statements in public and in a named schema (#28).

    python tests/bench/schema_plans.py

One scratch PostgreSQL, both schemas migrated and filled alike (5,000 due rows of a served
type, 5,000 of another), ANALYZEd; then EXPLAIN (COSTS OFF) of discover and of the gauges in each,
compared line by line with the schema's name taken out. The rewrite only qualifies names,
so the planner must pick the same plan."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slotd.dev.localpg import scratch  # noqa: E402
from slotd.repository import NewTask, enqueue_many, migrate  # noqa: E402
from slotd.repository.named import _sql, qualified  # noqa: E402
from slotd.repository.queue import limit_params  # noqa: E402

STATEMENTS = {
    "discover": lambda: {
        "types": ["bench.noop"],
        "limit": 20,
        "lead_s": 100.0,
        **limit_params({}, None),
    },
    "gauges": lambda: {"lead_s": 100.0, **limit_params({}, None)},
}


def main() -> None:
    with (
        scratch(prefix="slotd-plans-", port=5439) as server,
        psycopg.connect(server.url(), autocommit=True) as conn,
    ):
        plans: dict[str, dict[str, list[str]]] = {}
        for schema in ("public", "jobs"):
            migrate(conn, schema=schema)
            rows = [NewTask("bench.noop")] * 5000 + [NewTask("other")] * 5000
            enqueue_many(conn, rows, schema=schema)
            conn.execute(f"ANALYZE {qualified('slotd_tasks', schema)}")  # type: ignore[arg-type]
            for name, params in STATEMENTS.items():
                found = conn.execute("EXPLAIN (COSTS OFF) " + _sql(name, schema), params())
                lines = [row[0].replace(f'"{schema}".', "") for row in found]
                plans.setdefault(name, {})[schema] = lines
        for name, by_schema in plans.items():
            same = by_schema["public"] == by_schema["jobs"]
            print(
                f"{name}: {'same plan' if same else 'DIFFERENT'} ({len(by_schema['public'])} lines)"
            )
            if not same:
                print("\n".join(difflib.unified_diff(by_schema["public"], by_schema["jobs"])))


if __name__ == "__main__":
    main()
