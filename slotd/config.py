"""Settings: environment first, flags override, durations written like 1h30m."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from datetime import timedelta

from slotd.environment import BY_NAME
from slotd.environment import DEFAULT_METRICS_ADDR as DEFAULT_METRICS_ADDR
from slotd.errors import ConfigError

# The most a slot may claim in one statement: its ledger's batch record has room for this
# many leases of each state (slotd/slot/ledger.py, slotd/slot/batching.py).
CLAIM_BATCH_MAX = 20

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str | int | float | timedelta, *, name: str = "duration") -> timedelta:
    """`15s`, `10m`, `1h30m`, `7d` (a bare number is seconds)."""
    if isinstance(text, timedelta):
        return text
    if isinstance(text, int | float):
        return timedelta(seconds=text)
    raw = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        return timedelta(seconds=float(raw))
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise ConfigError(f"bad {name} {text!r}: write it like 15s, 10m, 1h30m or 7d")
    return timedelta(seconds=total)


def format_duration(value: timedelta | float) -> str:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m"), (sec, "s")) if n]
    return "".join(parts)


def _env(name: str, *fallbacks: str) -> str | None:
    for key in (name, *fallbacks):
        value = os.environ.get(key)
        if value:
            return value
    return None


def _raw(name: str) -> str | None:
    """Declared variable `name` as set (or its fallback: DATABASE_URL), else None. Every
    setting is read through its declaration in slotd/environment.py, which the settings
    reference is generated from, so an undeclared name fails at once (KeyError)."""
    variable = BY_NAME[name]
    return _env(variable.name, *variable.fallback)


def _default(name: str) -> str:
    return BY_NAME[name].default


def whole_number(raw: str, name: str, minimum: int = 0) -> int:
    """The one reading of a whole-number setting, wherever it is read: digits only
    (surrounding blanks allowed), at least `minimum`; else ConfigError (a ValueError)."""
    text = raw.strip()
    if not text.isascii() or not text.isdigit():
        raise ConfigError(f"bad {name} {raw!r}: expected a whole number")
    value = int(text)
    if value < minimum:
        raise ConfigError(f"bad {name} {raw!r}: must be at least {minimum}")
    return value


def max_attempts_value(value: object, name: str = "max_attempts") -> int:
    """A max_attempts given in code (enqueue, a handler option): a whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"bad {name} {value!r}: expected a whole number")
    if value < 1:
        raise ConfigError(f"bad {name} {value!r}: must be at least 1")
    return value


def max_attempts_from_env() -> int:
    """SLOTD_MAX_ATTEMPTS as every process reads it (the worker, the CLI, a producer)."""
    return _int("SLOTD_MAX_ATTEMPTS", minimum=1)


def _int(name: str, minimum: int = 0) -> int:
    return whole_number(_raw(name) or _default(name), name, minimum)


def _float(name: str, low: float = 0.0, high: float = 1.0) -> float:
    raw = _raw(name) or _default(name)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"bad {name} {raw!r}: expected a number") from None
    if not low <= value <= high:
        raise ConfigError(f"bad {name} {raw!r}: must be between {low} and {high}")
    return value


def _on_off(name: str) -> bool:
    raw = _raw(name) or _default(name)
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
    if raw.strip().lower() not in value:
        raise ConfigError(f"bad {name} {raw!r}: use on or off")
    return value[raw.strip().lower()]


def _duration(name: str) -> timedelta:
    return parse_duration(_raw(name) or _default(name), name=name)


def priority_step() -> timedelta:
    """SLOTD_PRIORITY_STEP: read by producers at every enqueue and by workers at start."""
    return _duration("SLOTD_PRIORITY_STEP")


DEFAULT_SCHEMA = _default("SLOTD_SCHEMA")
# A schema name as slotd accepts it: a plain lower-case identifier (quoted where used all
# the same, so a reserved word works). At most 48 bytes so that every channel name made
# from it (`slotd_control.<schema>`) stays inside PostgreSQL's 63-byte identifiers;
# `pg_` is reserved by PostgreSQL for its own schemas.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")


def validate_schema(name: object, *, source: str = "SLOTD_SCHEMA") -> str:
    """The schema name, or ConfigError (one line; the CLI exits 2)."""
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name) or name.startswith("pg_"):
        raise ConfigError(
            f"bad {source} {name!r}: use a lower-case identifier (letters, digits, _; "
            "at most 48 characters, not starting with a digit or pg_)"
        )
    return name


def default_schema() -> str:
    """SLOTD_SCHEMA as every process reads it (the daemon, a command, a producer that
    names none), else public."""
    raw = (_raw("SLOTD_SCHEMA") or "").strip()
    return validate_schema(raw) if raw else DEFAULT_SCHEMA


DEFAULT_KILL_GRACE = timedelta(seconds=5)


@dataclass(frozen=True)
class Faults:
    """Chaos for staging (SLOTD_FAULT_*): probabilities between 0 and 1."""

    error: float = 0.0
    latency: float = 0.0
    latency_seconds: float = 1.0
    crash: float = 0.0
    lost_settlement: float = 0.0
    slot_crash: float = 0.0
    slot_crash_settled: float = 0.0
    answer_lost: float = 0.0

    @property
    def any(self) -> bool:
        return any(
            (
                self.error,
                self.latency,
                self.crash,
                self.lost_settlement,
                self.slot_crash,
                self.slot_crash_settled,
                self.answer_lost,
            )
        )


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    database_url_read: str | None = None
    database_url_listen: str | None = None
    prepare: str = "auto"  # server-side prepared statements: auto (off behind a pooler), on, off
    slots: int = 4
    poll_interval: timedelta = timedelta(seconds=5)
    lease_margin: timedelta = timedelta(seconds=30)
    max_attempts: int = 20
    backoff_base: timedelta = timedelta(seconds=15)
    backoff_cap: timedelta = timedelta(minutes=10)
    backoff_jitter: float = 0.1
    retention: timedelta = timedelta(days=7)
    # SLOTD_KEEP_HISTORY: a success of a type without keep_history= stays answerable (its
    # state and attempts) this long; None (the default, or 0): it is gone at once.
    keep_history: timedelta | None = None
    shutdown_grace: timedelta = timedelta(seconds=25)
    # SLOTD_KILL_GRACE as given; None derives it from the margin (see `kill_grace`).
    kill_grace_setting: timedelta | None = None
    statement_timeout: timedelta = timedelta(seconds=30)
    heartbeat_interval: timedelta = timedelta(seconds=30)  # `slotd status` calls 1 min silent gone
    lock_timeout: timedelta = timedelta(seconds=5)
    # A transaction holding back vacuum this long is named in a warning (0: never; see
    # slotd/supervisor/horizon.py).
    horizon_warn: timedelta = timedelta(minutes=5)
    # How long `slotd run` waits for an unreachable database at start before exiting 2 (a
    # mistyped URL should not be retried for ever); once started, an outage is waited out.
    start_wait: timedelta = timedelta(seconds=10)
    synchronous_commit: bool = True  # off: the queue's own writes only, see sql/queries.sql
    discovery_batch: int = 20
    # A priority point is this much head start. Stamped by the producer at enqueue; a
    # worker uses its own only to bound its scans (keep it the same fleet-wide).
    priority_step: timedelta = timedelta(seconds=1)
    # SLOTD_SCHEMA: where every object of slotd lives; each statement names it.
    # Settings() too: every process reads it the same way (a test mode, a command).
    schema: str = field(default_factory=lambda: default_schema())
    # SLOTD_METRICS_ADDR as given; None is the default address, DEFAULT_METRICS_ADDR, which
    # gives way to a free port when another process holds it (see slotd/ops/metrics_server.py).
    metrics_addr: str | None = None
    home: str | None = None
    log_format: str = "text"
    runner_max_tasks: int = 0
    claim_batch: int = 20  # slotd.slot.batching.MAX_BATCH at most (the ledger's room)
    runner_max_rss_mib: int = 0
    faults: Faults = field(default_factory=Faults)
    allow_faults: bool = False

    @classmethod
    def from_env(cls) -> Settings:
        settings = cls(
            database_url=_raw("SLOTD_DATABASE_URL"),
            database_url_read=_raw("SLOTD_DATABASE_URL_READ"),
            database_url_listen=_raw("SLOTD_DATABASE_URL_LISTEN"),
            prepare=(_raw("SLOTD_PREPARE") or _default("SLOTD_PREPARE")).strip().lower(),
            slots=_int("SLOTD_SLOTS", minimum=1),
            poll_interval=_duration("SLOTD_POLL_INTERVAL"),
            lease_margin=_duration("SLOTD_LEASE_MARGIN"),
            max_attempts=max_attempts_from_env(),
            backoff_base=_duration("SLOTD_BACKOFF_BASE"),
            backoff_cap=_duration("SLOTD_BACKOFF_CAP"),
            backoff_jitter=_float("SLOTD_BACKOFF_JITTER"),
            retention=_duration("SLOTD_RETENTION"),
            keep_history=_duration("SLOTD_KEEP_HISTORY") or None,
            shutdown_grace=_duration("SLOTD_SHUTDOWN_GRACE"),
            kill_grace_setting=(
                _duration("SLOTD_KILL_GRACE") if _raw("SLOTD_KILL_GRACE") else None
            ),
            statement_timeout=_duration("SLOTD_STATEMENT_TIMEOUT"),
            heartbeat_interval=_duration("SLOTD_HEARTBEAT_INTERVAL"),
            lock_timeout=_duration("SLOTD_LOCK_TIMEOUT"),
            horizon_warn=_duration("SLOTD_HORIZON_WARN"),
            start_wait=_duration("SLOTD_START_WAIT"),
            synchronous_commit=_on_off("SLOTD_SYNCHRONOUS_COMMIT"),
            priority_step=priority_step(),
            schema=default_schema(),
            metrics_addr=_raw("SLOTD_METRICS_ADDR"),
            home=_raw("SLOTD_HOME"),
            log_format=(_raw("SLOTD_LOG_FORMAT") or _default("SLOTD_LOG_FORMAT")),
            runner_max_tasks=_int("SLOTD_RUNNER_MAX_TASKS"),
            claim_batch=_int("SLOTD_CLAIM_BATCH", minimum=1),
            runner_max_rss_mib=_int("SLOTD_RUNNER_MAX_RSS_MIB"),
            faults=Faults(
                error=_float("SLOTD_FAULT_ERROR"),
                latency=_float("SLOTD_FAULT_LATENCY"),
                latency_seconds=_duration("SLOTD_FAULT_LATENCY_SECONDS").total_seconds(),
                crash=_float("SLOTD_FAULT_CRASH"),
                lost_settlement=_float("SLOTD_FAULT_LOST_SETTLEMENT"),
                slot_crash=_float("SLOTD_FAULT_SLOT_CRASH"),
                slot_crash_settled=_float("SLOTD_FAULT_SLOT_CRASH_SETTLED"),
                answer_lost=_float("SLOTD_FAULT_ANSWER_LOST"),
            ),
            allow_faults=_raw("SLOTD_ALLOW_FAULTS") == "1",
        )
        return settings.validated()

    @property
    def kill_grace(self) -> timedelta:
        """From the deadline's interrupt to the kill: as set, else 5 s or half the margin
        when that is shorter. The kill and the settlement after it must both land inside
        the margin, so a short margin (SLOTD_LEASE_MARGIN=3s) gets a short grace instead
        of a refusal to start."""
        if self.kill_grace_setting is not None:
            return self.kill_grace_setting
        return min(DEFAULT_KILL_GRACE, self.lease_margin / 2)

    def with_(self, **changes: object) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None}).validated()

    def validated(self) -> Settings:
        validate_schema(self.schema)
        if self.prepare not in ("auto", "on", "off"):
            raise ConfigError(f"bad SLOTD_PREPARE {self.prepare!r}: use auto, on or off")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"bad log format {self.log_format!r}: use text or json")
        if self.kill_grace >= self.lease_margin:  # only an explicit pair can conflict
            raise ConfigError(
                f"SLOTD_KILL_GRACE ({format_duration(self.kill_grace)}) must be shorter than "
                f"SLOTD_LEASE_MARGIN ({format_duration(self.lease_margin)})"
            )
        if self.backoff_cap < self.backoff_base:
            raise ConfigError("SLOTD_BACKOFF_CAP must not be shorter than SLOTD_BACKOFF_BASE")
        if not timedelta(0) < self.heartbeat_interval < timedelta(minutes=1):
            raise ConfigError("SLOTD_HEARTBEAT_INTERVAL must be between 0 and 1m")
        if self.poll_interval.total_seconds() <= 0:
            raise ConfigError("SLOTD_POLL_INTERVAL must be positive")
        if not 1 <= self.claim_batch <= CLAIM_BATCH_MAX:
            raise ConfigError(f"SLOTD_CLAIM_BATCH must be between 1 and {CLAIM_BATCH_MAX}")
        return self
