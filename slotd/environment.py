"""Every environment variable slotd reads, declared once: its name, its default as it would
be written in the environment, and what it means. slotd/config.py reads the settings
through these declarations (so a default written here is the default used), and the
settings reference (docs/reference/settings.md) is generated from them by
tests/tools/reference_pages.py: tests/test_reference_pages.py fails when the page and these
disagree, and when slotd reads a SLOTD_* variable declared nowhere."""

from __future__ import annotations

from dataclasses import dataclass

# /metrics, /healthz and /readyz when SLOTD_METRICS_ADDR is not set.
DEFAULT_METRICS_ADDR = "127.0.0.1:9464"


@dataclass(frozen=True)
class Variable:
    name: str
    # As written in the environment ("5s", "4"); "" when unset means "nothing", and then
    # `shown` says what happens instead.
    default: str
    meaning: str
    section: str
    # Read when `name` is unset (DATABASE_URL for SLOTD_DATABASE_URL).
    fallback: tuple[str, ...] = ()
    # The command-line flag that overrides it, where there is one.
    flag: str | None = None
    # The default as the reference shows it, when it is not a value to write.
    shown: str | None = None


DATABASE = "Databases"
WORKER = "The worker"
RETRIES = "Attempts, retries and retention"
BOUNDS = "Statements and shutdown"
OPERATIONS = "Metrics, logs and the development database"
FAULTS = "Chaos for staging"

SECTIONS: dict[str, str] = {
    DATABASE: "Where slotd's tables are, and how it talks to them.",
    WORKER: "What `slotd run` serves, and how often it looks for work when nothing wakes it.",
    RETRIES: "The defaults a handler's own options (`max_attempts=`, `backoff_base=`, "
    "`keep_history=`) override.",
    BOUNDS: "Bounds on every statement slotd makes, and on a replica's start and stop.",
    OPERATIONS: "How a replica is watched, and the embedded development PostgreSQL.",
    FAULTS: "Probabilities between 0 and 1, injected by `slotd run` only; refused unless "
    "`SLOTD_ALLOW_FAULTS=1`.",
}

VARIABLES: tuple[Variable, ...] = (
    Variable(
        "SLOTD_DATABASE_URL",
        "",
        "the primary: claims, settlements, enqueues from the command line",
        DATABASE,
        fallback=("DATABASE_URL",),
        shown="the embedded development PostgreSQL",
    ),
    Variable(
        "SLOTD_DATABASE_URL_READ",
        "",
        "discovery's reads (a replica of the primary may serve them)",
        DATABASE,
        fallback=("DATABASE_URL_READ",),
        shown="the primary",
    ),
    Variable(
        "SLOTD_DATABASE_URL_LISTEN",
        "",
        "LISTEN alone: a direct connection when the primary's URL is a transaction pool "
        "(see [PgBouncer](../how-to/pgbouncer.md))",
        DATABASE,
        shown="the primary",
    ),
    Variable(
        "SLOTD_PREPARE",
        "auto",
        "server-side prepared statements: `auto` (off through a pooler, detected per "
        "connection), `on`, `off`",
        DATABASE,
    ),
    Variable(
        "SLOTD_SCHEMA",
        "public",
        "the schema holding every table, index and notification channel of slotd (see "
        "[several queues in one database](../how-to/several-queues.md))",
        DATABASE,
    ),
    Variable(
        "SLOTD_SYNCHRONOUS_COMMIT",
        "on",
        "`off`: claims and settlements do not wait for the WAL flush (a server crash may "
        "re-run a task; enqueues unaffected)",
        DATABASE,
    ),
    Variable(
        "SLOTD_APP",
        "",
        "`MODULE:ATTR` of the registry `slotd run` serves",
        WORKER,
        flag="--app",
        shown="none",
    ),
    Variable("SLOTD_SLOTS", "4", "slot processes per replica", WORKER, flag="--slots"),
    Variable(
        "SLOTD_POLL_INTERVAL",
        "5s",
        "the backstop ticker: how often an idle replica looks for work nothing woke it for "
        "(delays and backoffs wake a slot when they fall due)",
        WORKER,
    ),
    Variable(
        "SLOTD_HEARTBEAT_INTERVAL",
        "30s",
        "how often a replica announces itself (`slotd status` shows it live for a minute); "
        "under 1m",
        WORKER,
    ),
    Variable(
        "SLOTD_PRIORITY_STEP",
        "1s",
        "a priority point is this much head start (stamped on each row at enqueue; keep it "
        "the same fleet-wide)",
        WORKER,
    ),
    Variable(
        "SLOTD_RUNNER_MAX_TASKS",
        "0",
        "recycle a slot's runner process after this many tasks (0: never)",
        WORKER,
    ),
    Variable(
        "SLOTD_CLAIM_BATCH",
        "20",
        "at depth, the most tasks a slot claims (and settles) in one statement, each under its"
        " own lease; 1: one per statement, nothing prefetched (at most 20)",
        WORKER,
    ),
    Variable(
        "SLOTD_RUNNER_MAX_RSS_MIB",
        "0",
        "recycle a slot's runner process, between tasks, once it uses this much memory (0: never)",
        WORKER,
    ),
    Variable(
        "SLOTD_MAX_ATTEMPTS",
        "20",
        "the dead-letter threshold: the worker that claims a task stamps its own on the row "
        "(a handler's `max_attempts=` or an explicit one at enqueue wins)",
        RETRIES,
    ),
    Variable(
        "SLOTD_BACKOFF_BASE",
        "15s",
        "the first retry's delay; each next one doubles it",
        RETRIES,
    ),
    Variable(
        "SLOTD_BACKOFF_CAP",
        "10m",
        "the longest delay between attempts (not shorter than the base)",
        RETRIES,
    ),
    Variable(
        "SLOTD_BACKOFF_JITTER",
        "0.1",
        "each delay is shortened by up to this fraction, at random, so failures that happened "
        "together do not retry together",
        RETRIES,
    ),
    Variable(
        "SLOTD_RETENTION",
        "7d",
        "dead letters (and events, attempts) older than this are pruned, hourly",
        RETRIES,
    ),
    Variable(
        "SLOTD_KEEP_HISTORY",
        "0s",
        "a success of a type without `keep_history=` stays answerable this long: "
        "`slotd.result` says succeeded and lists its attempts (its value only with "
        "`keep_result`); 0: gone at once, the plain path",
        RETRIES,
        shown="0 (off)",
    ),
    Variable(
        "SLOTD_LEASE_MARGIN",
        "30s",
        "a lease is the handler's ceiling plus this margin",
        BOUNDS,
    ),
    Variable(
        "SLOTD_KILL_GRACE",
        "",
        "a handler is interrupted at its deadline and killed this much later (shorter than "
        "the margin)",
        BOUNDS,
        shown="5s, or half the margin when that is shorter",
    ),
    Variable(
        "SLOTD_SHUTDOWN_GRACE",
        "25s",
        "on SIGTERM, how long cancelled handlers get before their slot is killed",
        BOUNDS,
    ),
    Variable(
        "SLOTD_STATEMENT_TIMEOUT",
        "30s",
        "`SET LOCAL statement_timeout` on every write-lane statement (per statement, so a "
        "transaction pool keeps it)",
        BOUNDS,
    ),
    Variable(
        "SLOTD_LOCK_TIMEOUT",
        "5s",
        "`SET LOCAL lock_timeout` on every write-lane statement",
        BOUNDS,
    ),
    Variable(
        "SLOTD_START_WAIT",
        "10s",
        "how long `slotd run` waits at start for a database it cannot reach, then one line "
        "and exit 2 (a mistyped URL); one that refuses it (password, no such database) "
        "exits at once. After a good start an outage is waited out for ever",
        BOUNDS,
    ),
    Variable(
        "SLOTD_HORIZON_WARN",
        "5m",
        "a transaction holding back vacuum this long is named in a warning and in `slotd "
        "status` (0: never read; see [a transaction held open](../how-to/held-transaction.md))",
        BOUNDS,
    ),
    Variable(
        "SLOTD_METRICS_ADDR",
        "",
        "`host:port` of /metrics, /healthz and /readyz (`off` disables, port 0 picks one). "
        "Not set and 127.0.0.1:9464 taken (a second replica on the host): a free port, "
        "named in one warning. Set and taken: one line, exit 2",
        OPERATIONS,
        flag="--metrics-addr",
        shown=f"`{DEFAULT_METRICS_ADDR}`",
    ),
    Variable(
        "SLOTD_LOG_FORMAT",
        "text",
        "`text` or `json`",
        OPERATIONS,
        flag="--log-format",
    ),
    Variable(
        "SLOTD_HOME",
        "",
        "where the embedded development PostgreSQL keeps its data and socket",
        OPERATIONS,
        shown="`~/.local/share/slotd` (root: `/var/lib/slotd`)",
    ),
    Variable(
        "SLOTD_PG_BINDIR",
        "",
        "the PostgreSQL server binaries the embedded database (and slotd's test harness) runs",
        OPERATIONS,
        shown="the newest found (`/usr/lib/postgresql/*/bin`, `initdb` on PATH), else the "
        "`embedded` extra's",
    ),
    Variable("SLOTD_ALLOW_FAULTS", "", "`1` allows the variables below", FAULTS, shown="unset"),
    Variable("SLOTD_FAULT_ERROR", "0", "the runner raises instead of calling the handler", FAULTS),
    Variable(
        "SLOTD_FAULT_LATENCY",
        "0",
        "the runner sleeps before the handler, eating into its deadline",
        FAULTS,
    ),
    Variable("SLOTD_FAULT_LATENCY_SECONDS", "1s", "how long that sleep is", FAULTS),
    Variable("SLOTD_FAULT_CRASH", "0", "the runner process exits before the handler", FAULTS),
    Variable(
        "SLOTD_FAULT_LOST_SETTLEMENT",
        "0",
        "the slot skips the settlement: the lease lapses and the task runs again",
        FAULTS,
    ),
    Variable(
        "SLOTD_FAULT_SLOT_CRASH",
        "0",
        "the slot exits after its last words, before the settlement (its supervisor settles)",
        FAULTS,
    ),
    Variable(
        "SLOTD_FAULT_SLOT_CRASH_SETTLED",
        "0",
        "the slot exits after its settlement, before the lease leaves its ledger",
        FAULTS,
    ),
    Variable(
        "SLOTD_FAULT_ANSWER_LOST",
        "0",
        "the slot's connection closes after a success committed, before its answer is read",
        FAULTS,
    ),
)

BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}

# SLOTD_* names read from the environment that are not settings a user writes: set by one
# of slotd's processes for another.
INTERNAL: dict[str, str] = {
    "SLOTD_DJANGO_QUEUES": "set by `manage.py slotd run --queue` for the worker it starts",
}
