"""Eager mode: `slotd.enqueue` claims, runs and settles what it enqueued before returning
(see "Eager mode" in the slotd.testing docstring)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

from slotd.config import Settings
from slotd.lifecycle import Settlement
from slotd.outcome import Outcome
from slotd.registry import Registry
from slotd.repository import Executor, Repository
from slotd.runner.processor import process
from slotd.task import Task
from slotd.testing.hooks import _hooked
from slotd.testing.inline import TaskFailed, _connection, _LockWatch, _rebased


def _failed(task: Task, settlement: Settlement, cls: type[TaskFailed] = TaskFailed) -> TaskFailed:
    last = (settlement.error or "").strip().splitlines()[-1:] or [""]
    reason = f": {last[0]}" if last[0] else ""
    dead = " (dead letter)" if settlement.dead else ""
    return cls(
        f"task {task.type}#{task.id} attempt {task.attempt}: {settlement.outcome}{dead}{reason}"
    )


class Eager:
    """Runs each task enqueued under it inline; see the slotd.testing docstring."""

    max_slices = 10_000  # a sliced handler that never finishes must not hang the test

    def __init__(self, registry: Registry, repo: Repository, *, propagate: bool = False) -> None:
        self.registry = registry
        self.repo = repo
        self.propagate = propagate
        self.settlements: list[tuple[Task, Settlement]] = []

    def _repo_for(self, target: Executor) -> Repository:
        # The enqueueing connection is the one certain to see its uncommitted row, so
        # the claim and the settlement go through it, with this repo's settings.
        conn = _connection(target)
        if conn is self.repo.write:
            return self.repo
        clone = copy.copy(self.repo)
        clone.write = clone.read = conn
        return clone

    def __call__(self, target: Executor, ids: list[int], schema: str) -> None:
        if schema != self.repo.schema:
            return  # another schema's queue: not the one this runner claims from
        repo = self._repo_for(target)
        for task_id in dict.fromkeys(ids):  # a batch can name one live row twice (keys)
            self._run(repo, task_id)

    def _run(self, repo: Repository, task_id: int) -> None:
        for _ in range(self.max_slices):
            claimed = repo.claim([task_id], self.registry)
            if claimed is None:
                return  # delayed, backing off, unregistered type, or already run
            with _LockWatch(repo.write) as watch:
                settlement = process(repo, self.registry, _rebased(claimed))
            task = claimed.task()
            self.settlements.append((task, settlement))
            watch.check(task, settlement)
            if settlement.outcome is Outcome.CONTINUED:
                continue  # the daemon would claim the next slice at once; so do we
            # A snooze is the handler's "not yet", not a failure: nothing to propagate.
            quiet = (Outcome.SUCCESS, Outcome.SNOOZED)
            if self.propagate and settlement.outcome not in quiet:
                raise _failed(task, settlement) from settlement.exception
            return
        raise TaskFailed(f"task {task_id}: still continuing after {self.max_slices} slices")


@contextmanager
def eager(
    registry: Registry,
    repo_or_conn: Repository | Executor,
    *,
    settings: Settings | None = None,
    propagate: bool = False,
) -> Iterator[Eager]:
    """Within the block, `slotd.enqueue` runs what it enqueued inline before returning.
    `repo_or_conn` gives the settings (lease margin, backoff) and the connection used when
    the enqueue's own is the same; an enqueue on another connection is claimed on that
    one, the only one certain to see the row."""
    if isinstance(repo_or_conn, Repository):
        repo = repo_or_conn
    else:
        repo = Repository.from_settings(settings or Settings(), _connection(repo_or_conn))
    runner = Eager(registry, repo, propagate=propagate)
    with _hooked(runner):
        yield runner
