"""A task's states: the one vocabulary every surface uses (slotd.result, `slotd status`,
slotd.tasks(state=), the dashboard, Django's results). The state itself is the database's
function slotd_task_state(t) over the task's row (sql/090_task_state.sql; in statements,
the fragment `task_state`: splice it as `{task_state}` into a statement that aliases
slotd_tasks as t); the diagram of states and named transitions is in docs/ARCHITECTURE.md,
"A task's states"."""

from __future__ import annotations

from enum import StrEnum

from slotd.repository.named import Executor, _sql


class State(StrEnum):
    SCHEDULED = "scheduled"  # not due yet, no attempt ran
    PENDING = "pending"  # due, waiting for a slot
    RUNNING = "running"  # an attempt holds a live lease
    RETRYING = "retrying"  # an attempt failed, the next is due later
    WAITING = "waiting"  # on its parents (later: its sequence, an event, a durable sleep)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


STATES: tuple[str, ...] = tuple(s.value for s in State)
TERMINAL: frozenset[str] = frozenset(
    (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED)
)
LIVE: tuple[str, ...] = tuple(s for s in STATES if s not in TERMINAL)
# The terminal states a dead letter can be in (`slotd status`'s DEAD column).
DEAD: frozenset[str] = TERMINAL - {State.SUCCEEDED}


def validate_state(value: str) -> str:
    """`value` if it names a state, else ValueError naming them."""
    if value not in STATES:
        raise ValueError(f"unknown state {value!r}: one of {', '.join(STATES)}")
    return value


def state_counts(target: Executor, *, schema: str | None = None) -> dict[str, dict[str, int]]:
    """Every task row's state, counted per type: {type: {state: n}} (`slotd status`).
    Succeeded tasks have no row and are not counted."""
    out: dict[str, dict[str, int]] = {}
    for task_type, state, n in target.execute(_sql("state_counts", schema)).fetchall():
        out.setdefault(task_type, {})[state] = int(n)
    return out
