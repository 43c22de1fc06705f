"""The operator's commands, run in-process against a real database, and their exit codes."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from slotd.cli import main

SECRET = "hunter2"
UNREACHABLE = f"postgresql://slotd:{SECRET}@/jobs?host=/nonexistent/slotd-sock&connect_timeout=2"


def run_cli(db_url: str, *args: str, url: str | None = None, input: str | None = None) -> Result:
    """The commands in-process, as `slotd ARGS` with SLOTD_DATABASE_URL set."""
    env = {"SLOTD_DATABASE_URL": url or db_url, "SLOTD_DATABASE_URL_READ": None}
    return CliRunner().invoke(main, list(args), env=env, input=input)


@pytest.fixture
def cli(db_url: str) -> Any:
    return lambda *args, **kw: run_cli(db_url, *args, **kw)


def add(conn: psycopg.Connection[Any], task_type: str, **cols: str) -> int:
    names = ["task_type", *cols]
    values = ["%s", *cols.values()]
    sql = f"INSERT INTO slotd_tasks ({', '.join(names)}) VALUES ({', '.join(values)}) RETURNING id"
    return conn.execute(sql, (task_type,)).fetchone()[0]  # type: ignore[arg-type,index]


def dead(
    conn: psycopg.Connection[Any], task_type: str = "audit", age: str = "1 day", **kw: str
) -> int:
    return add(
        conn,
        task_type,
        attempt_count="20",
        last_attempted_at=f"now() - interval '{age}'",
        last_error="'boom'",
        **kw,
    )


def row(conn: psycopg.Connection[Any], task_id: int) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT attempt_count, run_at <= now(), payload, key FROM slotd_tasks WHERE id = %s",
        (task_id,),
    ).fetchone()


def one_error_line(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert lines[0].startswith(("slotd: ", "Error: ")), lines[0]
    return lines[0]


# enqueue


def test_enqueue_commits_and_prints_the_id(cli: Any, conn: psycopg.Connection[Any]) -> None:
    result = cli("enqueue", "audit", '{"org": 7}', "--key", "org:7")
    assert result.exit_code == 0, result.output
    task_id = int(result.stdout.strip())
    assert row(conn, task_id) == (0, True, {"org": 7}, "org:7")
    # The same key while the first is live: the live row's id.
    again = cli("enqueue", "audit", '{"org": 8}', "--key", "org:7")
    assert int(again.stdout) == task_id


def test_enqueue_with_delay_and_no_payload(cli: Any, conn: psycopg.Connection[Any]) -> None:
    result = cli("enqueue", "audit", "--delay", "30m")
    assert result.exit_code == 0
    task_id = int(result.stdout)
    delay = conn.execute(
        "SELECT extract(epoch FROM run_at - now()) FROM slotd_tasks WHERE id = %s", (task_id,)
    ).fetchone()[0]  # type: ignore[index]
    assert 1790 < delay <= 1800
    assert row(conn, task_id)[2] == {}  # type: ignore[index]


def test_enqueue_takes_priority_and_group(cli: Any, conn: psycopg.Connection[Any]) -> None:
    result = cli("enqueue", "audit", "--priority", "10", "--group", "org:42")
    assert result.exit_code == 0, result.output
    found = conn.execute(
        "SELECT priority, task_group, extract(epoch FROM run_at - order_at) FROM slotd_tasks"
        " WHERE id = %s",
        (int(result.stdout),),
    ).fetchone()
    assert found == (10, "org:42", 10)  # ten points of 1 s: ordered 10 s earlier
    plain = cli("enqueue", "audit")
    assert conn.execute(
        "SELECT priority, task_group FROM slotd_tasks WHERE id = %s", (int(plain.stdout),)
    ).fetchone() == (0, None)


def test_enqueue_unique_pending_queues_behind_a_started_task(
    cli: Any, conn: psycopg.Connection[Any]
) -> None:
    first = int(cli("enqueue", "audit", "--key", "u:7", "--unique", "pending").stdout)
    assert int(cli("enqueue", "audit", "--key", "u:7", "--unique", "pending").stdout) == first
    # As a claim does to a unique="pending" task: its key moves out of the dedupe index.
    conn.execute(
        "UPDATE slotd_tasks SET started_key = key, key = NULL, lease_token = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 minute', attempt_count = 1"
    )
    behind = int(cli("enqueue", "audit", "--key", "u:7", "--unique", "pending").stdout)
    assert behind != first


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("audit", "--priority", "101"), "--priority"),
        (("audit", "--priority", "high"), "--priority"),
        (("audit", "--group", " "), "bad --group"),
        (("audit", "--unique", "pending"), "needs a --key"),
        (("audit", "--key", "k", "--unique", "maybe"), "--unique"),
        (("audit", "{not json"), "not JSON"),
        (("audit", "[1, 2]"), "JSON object"),
        (("audit", '{"x": NaN}'), "NaN"),
        (("Bad Type", "{}"), "invalid task type"),
        (("audit", "--delay", "soon"), "bad --delay"),
    ],
)
def test_enqueue_bad_input_exits_2_before_touching_the_database(
    cli: Any, args: tuple[str, ...], says: str
) -> None:
    # An unreachable database proves validation happens first.
    line = one_error_line(cli("enqueue", *args, url=UNREACHABLE), 2)
    assert says in line


# status


def test_status_table_and_json(cli: Any, conn: psycopg.Connection[Any]) -> None:
    add(conn, "audit", run_at="now() - interval '90 seconds'")
    add(
        conn,
        "audit",
        attempt_count="1",
        lease_token="gen_random_uuid()",
        lease_expires_at="now() + interval '5 minutes'",
    )
    dead(conn, "reindex")
    conn.execute(
        "INSERT INTO slotd_replicas (replica_id, hostname, pid, slots, task_types) "
        "VALUES ('r1', 'web-1', 100, 4, '{audit,reindex}'), ('r2', 'web-2', 200, 2, '{audit}')"
    )
    result = cli("status", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["pending"] == {"audit": 2}  # the gauge's: running tasks too
    assert report["running"] == {"audit": 1}
    assert report["states"] == {"audit": {"pending": 1, "running": 1}, "reindex": {"failed": 1}}
    assert report["dead"] == {"reindex": 1}
    assert 90 <= report["oldest_due_seconds"] < 150
    assert set(report["oldest_due_by_type"]) == {"audit"}
    assert [r["hostname"] for r in report["replicas"]] == ["web-1", "web-2"]
    assert report["slots"] == 6

    text = cli("status")
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    heads = ["TYPE", "SCHEDULED", "PENDING", "RUNNING", "RETRYING", "WAITING", "DEAD"]
    assert lines[0].split() == [*heads, "OLDEST", "DUE"]
    # Each task in one column: the running one is not pending as well (#37).
    assert lines[1].split()[:7] == ["audit", "0", "1", "1", "0", "0", "0"]
    assert lines[2].split() == ["reindex", "0", "0", "0", "0", "0", "1", "-"]
    assert "replicas: 2 live, 6 slots" in text.stdout
    assert "web-2" in text.stdout


def test_status_on_an_empty_queue(cli: Any) -> None:
    result = cli("status")
    assert result.exit_code == 0
    assert "no tasks" in result.stdout and "replicas: 0 live" in result.stdout


def test_unreachable_database_is_one_line_exit_1_without_the_password(cli: Any) -> None:
    for args in (("status",), ("dead", "list"), ("cleanup",), ("enqueue", "audit")):
        result = cli(*args, url=UNREACHABLE)
        line = one_error_line(result, 1)
        assert "database error" in line
        assert SECRET not in result.output


def test_bad_database_url_exits_2_without_the_password(cli: Any) -> None:
    result = cli("status", url=f"postgresql://slotd:{SECRET}@/jobs?nosuchoption=1")
    one_error_line(result, 2)
    assert SECRET not in result.output


# dead letters


def test_dead_list(cli: Any, conn: psycopg.Connection[Any]) -> None:
    first = dead(conn, "audit", age="2 days")
    second = dead(conn, "reindex", age="1 day")
    add(conn, "audit")  # live, never listed

    result = cli("dead", "list", "--json")
    assert result.exit_code == 0
    listed = json.loads(result.stdout)
    assert [r["id"] for r in listed] == [second, first]  # most recent first
    assert listed[0]["last_error"] == "boom"

    only = json.loads(cli("dead", "list", "--type", "audit", "--json").stdout)
    assert [r["id"] for r in only] == [first]
    assert json.loads(cli("dead", "list", "--id", str(first), "--json").stdout)[0]["id"] == first

    table = cli("dead", "list", "--limit", "1")
    assert table.exit_code == 0
    assert table.stdout.splitlines()[0].split()[:4] == ["ID", "TYPE", "REASON", "ATTEMPTS"]
    assert str(second) in table.stdout and "(1 of 2; --limit shows more)" in table.stdout

    missing = cli("dead", "list", "--id", "999999")
    assert "no dead letter with id 999999" in one_error_line(missing, 1)


def test_dead_retry_by_id_type_and_all(cli: Any, conn: psycopg.Connection[Any]) -> None:
    a = dead(conn, "audit")
    b = dead(conn, "audit")
    c = dead(conn, "reindex")
    d = dead(conn, "other")

    result = cli("dead", "retry", "--id", str(a))
    assert (result.exit_code, result.stdout.strip()) == (0, "retried 1 dead letter")
    assert row(conn, a)[:2] == (0, True)  # type: ignore[index]
    assert row(conn, b)[0] == 20  # type: ignore[index]

    assert cli("dead", "retry", "--type", "audit").stdout.strip() == "retried 1 dead letter"
    assert row(conn, b)[:2] == (0, True)  # type: ignore[index]
    assert row(conn, c)[0] == 20  # type: ignore[index]

    assert cli("dead", "retry", "--all").stdout.strip() == "retried 2 dead letters"
    assert row(conn, c)[0] == 0 and row(conn, d)[0] == 0  # type: ignore[index]


def test_dead_retry_unknown_id_changes_nothing(cli: Any, conn: psycopg.Connection[Any]) -> None:
    known = dead(conn)
    live = add(conn, "audit")
    result = cli("dead", "retry", "--id", str(known), "--id", str(live), "--id", "999999")
    line = one_error_line(result, 1)
    assert f"no dead letter with id {live}, 999999" in line
    assert row(conn, known)[0] == 20  # type: ignore[index]


def test_dead_retry_leaves_a_keyed_row_whose_key_is_live(
    cli: Any, conn: psycopg.Connection[Any]
) -> None:
    stale = dead(conn, key="'org:1'")
    add(conn, "audit", key="'org:1'")
    result = cli("dead", "retry", "--all")
    assert result.exit_code == 0
    assert result.stdout.strip() == "retried 0 dead letters"
    assert "1 left dead: a live task with the same key already exists" in result.stderr
    assert row(conn, stale)[0] == 20  # type: ignore[index]


def test_dead_retry_revives_one_of_two_dead_letters_sharing_a_key(
    cli: Any, conn: psycopg.Connection[Any]
) -> None:
    older = dead(conn, key="'org:2'")
    newer = dead(conn, key="'org:2'")
    other = dead(conn)
    result = cli("dead", "retry", "--all")
    assert result.exit_code == 0, result.output  # not a unique violation for the batch
    assert result.stdout.strip() == "retried 2 dead letters"
    assert "1 left dead" in result.stderr
    assert [row(conn, i)[0] for i in (older, newer, other)] == [20, 0, 0]  # type: ignore[index]


def test_dead_retry_counts_a_live_row_on_its_final_attempt(
    cli: Any, conn: psycopg.Connection[Any]
) -> None:
    stale = dead(conn, key="'org:3'")
    # The key's live row: on its final attempt, a worker holding its lease.
    add(conn, "audit", key="'org:3'", attempt_count="20", lease_token="gen_random_uuid()",
        lease_expires_at="now() + interval '1 minute'")  # fmt: skip
    result = cli("dead", "retry", "--all")
    assert result.stdout.strip() == "retried 0 dead letters"
    assert row(conn, stale)[0] == 20  # type: ignore[index]


@pytest.mark.parametrize(
    "args",
    [
        ("dead", "retry"),
        ("dead", "retry", "--all", "--type", "audit"),
        ("dead", "purge", "--yes"),
        ("dead", "purge", "--all", "--older-than", "a week", "--yes"),
        ("dead", "list", "--type", "Not A Type"),
        ("cleanup", "--retention", "forever"),
    ],
)
def test_bad_usage_exits_2(cli: Any, args: tuple[str, ...]) -> None:
    one_error_line(cli(*args, url=UNREACHABLE), 2)


def test_click_parse_errors_exit_2_with_one_line(cli: Any) -> None:
    result = cli("dead", "retry", "--id", "x", url=UNREACHABLE)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        "slotd: Invalid value for '--id': 'x' is not a task id "
        "(the number `slotd enqueue` printed, like 42)"
    ]


@pytest.mark.parametrize("arg", ["abc", "0", "-5", "1.5"])
def test_a_task_id_that_is_not_one_says_so(cli: Any, arg: str) -> None:
    """Once "'abc' is not a valid integer range": click's words for its own type."""
    line = one_error_line(cli("result", "--", arg, url=UNREACHABLE), 2)
    assert line == (
        f"slotd: Invalid value for 'ID': '{arg}' is not a task id "
        "(the number `slotd enqueue` printed, like 42)"
    )


def test_dead_purge(cli: Any, conn: psycopg.Connection[Any]) -> None:
    old = [dead(conn, "audit", age="10 days") for _ in range(3)]
    recent = dead(conn, "audit", age="1 hour")
    other = dead(conn, "reindex", age="10 days")
    live = add(conn, "audit")

    # Asked first; no answer is no.
    refused = cli("dead", "purge", "--type", "audit", input="n\n")
    assert refused.exit_code == 1 and row(conn, old[0]) is not None

    result = cli("dead", "purge", "--type", "audit", "--older-than", "7d", input="y\n")
    assert result.exit_code == 0, result.output
    assert "purge 3 dead letters?" in result.stdout
    assert result.stdout.strip().endswith("purged 3 dead letters")
    assert all(row(conn, i) is None for i in old)
    assert row(conn, recent) is not None and row(conn, other) is not None

    by_id = cli("dead", "purge", "--id", str(recent), "--yes")
    assert by_id.stdout.strip() == "purged 1 dead letter"
    assert "no dead letter with id" in one_error_line(cli("dead", "purge", "--id", "999999"), 1)

    assert cli("dead", "purge", "--all", "--yes").stdout.strip() == "purged 1 dead letter"
    assert row(conn, other) is None and row(conn, live) is not None


def test_dead_purge_in_batches(
    cli: Any, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("slotd.commands.dead.PURGE_BATCH", 4)
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, attempt_count, last_attempted_at) "
        "SELECT 'audit', 20, now() FROM generate_series(1, 10)"
    )
    result = cli("dead", "purge", "--all", "--yes")
    assert result.stdout.strip() == "purged 10 dead letters"


def test_dead_purge_interrupted_keeps_finished_batches(
    cli: Any, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotd.repository import Repository

    monkeypatch.setattr("slotd.commands.dead.PURGE_BATCH", 4)
    conn.execute(
        "INSERT INTO slotd_tasks (task_type, attempt_count, last_attempted_at) "
        "SELECT 'audit', 20, now() FROM generate_series(1, 10)"
    )
    real = Repository.dead_purge_batch
    calls = 0

    def ctrl_c_on_second(self: Repository, *args: Any, **kwargs: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Repository, "dead_purge_batch", ctrl_c_on_second)
    result = cli("dead", "purge", "--all", "--yes")
    assert result.exit_code == 130
    assert "interrupted: purged 4 of 10" in result.stderr
    count = conn.execute("SELECT count(*) FROM slotd_tasks").fetchone()[0]  # type: ignore[index]
    assert count == 6


# cleanup


def test_cleanup(cli: Any, conn: psycopg.Connection[Any]) -> None:
    old = dead(conn, age="8 days")
    young = dead(conn, age="2 days")
    result = cli("cleanup")
    assert (result.exit_code, result.stdout.strip()) == (
        0,
        "pruned 1 dead letters older than 7d",
    )
    assert row(conn, old) is None and row(conn, young) is not None
    assert cli("cleanup", "--retention", "1d").stdout.startswith("pruned 1 ")
    assert row(conn, young) is None
