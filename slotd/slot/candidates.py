"""A slot's candidates: what its last discovery found, claimed from the head.

One discovery (on the read lane, a read: no attempt burnt) serves up to a batch of claims.
Every slot takes the candidates in the discovery's order (ordering key, then id): slots that
discovered the same rows all start at the head, and the claim's SKIP LOCKED (and its recheck
of a row leased meanwhile) gives each the first row nobody else holds, so nothing starts
before an older-keyed claimable task. A rotation per slot spread the contention, and started
lower-priority rows before the head of the queue.

How many a discovery asks for follows what the last one cost. A discovery walks the due
index from its head, and what lies there when vacuum cannot clean it (a transaction held
open somewhere holds back the xmin horizon) is the index entries of every task finished
since: the walk then grows with the work done, to 150 ms a discovery at 100k such entries,
and slots that each rediscover every discovery_batch x slots tasks spent the server on
nothing else (the soak's held xmin: 311 -> 69 tasks/s, tests/bench/RESULTS.md). A discovery
is about as dear for a thousand rows as for eighty, so a slow one asks for more: enough that
its time over the candidates it returns stays under DISCOVERY_BUDGET_S each, at most
MAX_WIDEN x the configured size. On a healthy table a discovery takes well under a
millisecond and the size stays as configured. The price, only while discovery is slow: a
task enqueued with a better key waits for the next discovery of the slot that would take
it, which comes after more claims than usual."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from slotd.registry import Registry
from slotd.repository import Claimed, Repository

# Of a discovery's time, what one candidate it returns may carry (see the module's comment):
# at 4 slots the fleet then spends at most 4 x this on discovery per task it runs.
DISCOVERY_BUDGET_S = 0.0001
MAX_WIDEN = 50


class Candidates:
    def __init__(
        self, discovery_batch: int, slots: int, budget_s: float = DISCOVERY_BUDGET_S
    ) -> None:
        self.batch: list[int] = []
        self.per_claim = discovery_batch
        self.base = discovery_batch * slots  # what a discovery asks for on a healthy table
        self.limit = self.base  # what the next one asks for
        self.budget_s = budget_s
        # Seconds until a full rate window has room or the next row not yet due is due,
        # from the last discovery (None: neither): when a claim finds nothing, the next wake
        # (slotd.supervisor.wake.Tokens.retry_in), so a delay or a backoff starts when due,
        # not at the next poll tick.
        self.retry_in: float | None = None

    def next_claim(
        self, repo: Repository, registry: Registry, report: Callable[..., Any]
    ) -> Claimed | None:
        """Claim from what the last discovery found before discovering again. A registry
        with fair types (#39) claims from a fresh discovery each time, and never on a
        settlement: whose turn it is changes with every start (sql `discover_fair`)."""
        claimed = self._next_claim(repo, registry, report)
        if registry.fair_types:
            self.batch = []
        return claimed

    def _next_claim(
        self, repo: Repository, registry: Registry, report: Callable[..., Any]
    ) -> Claimed | None:
        if self.batch and (claimed := self._claim(repo, registry)) is not None:
            return claimed
        if not self._discover(repo, registry, report, on_primary=False):
            return None
        if (claimed := self._claim(repo, registry)) is not None:
            return claimed
        # Every candidate missed: other slots took them, or a lagging read lane offered rows
        # the primary already finished. One more look, on the primary (bounded: then the
        # normal path), so replica lag costs a round trip rather than a poll interval.
        if repo.has_read_lane:
            report("read_miss")
        if not self._discover(repo, registry, report, on_primary=True):
            return None
        return self._claim(repo, registry)

    def window(self) -> list[int]:
        """What a claim riding on a settlement offers: the head, not all of them. It takes
        the first claimable; the rest are tried in a claim of their own if these are gone."""
        return self.batch[: self.per_claim]

    def chained(self, tried: bool, claimed: Claimed | None) -> None:
        """After a settlement that offered `window()`: drop what the claim consumed."""
        if not tried:
            return
        if claimed is not None:
            self.consumed(claimed)
        else:  # every candidate offered was gone: the rest may not be
            self.batch = self.batch[self.per_claim :]

    def offered(self) -> list[int]:
        """What a batched claim riding on a settlement offers: a discovery's healthy size
        at most, as `_claim` offers."""
        return self.batch[: self.base]

    def chained_many(self, offered: list[int], claims: list[Claimed]) -> None:
        """After a batched claim that offered `offered`: drop what it consumed."""
        if claims:
            self.consumed(claims[-1])
        else:
            self.batch = self.batch[len(offered) :]

    def consumed(self, claimed: Claimed) -> None:
        # The claim takes the oldest claimable candidate, so every candidate before it was
        # already taken by another slot: drop those too rather than try them again.
        if claimed.id in self.batch:
            self.batch = self.batch[self.batch.index(claimed.id) + 1 :]

    def forget(self) -> None:
        self.batch = []

    def warm(self, repo: Repository, registry: Registry) -> None:
        """A new connection's first claims, before the first task waits on them: the
        discovery and the claim, each run until psycopg has prepared it (its
        prepare_threshold + 1 runs; once where nothing is prepared, behind a pooler: the
        backend's catalog caches). Planned cold, each was 1.5-3 ms of the first tasks'
        start on every new slot: 20 of 300 starts at 50 tasks/s, their p99 (#43). The
        claim offers no row (id 0 is never a task's), so it takes nothing."""
        runs = 1 if repo.write.prepare_threshold is None else repo.write.prepare_threshold + 1
        for _ in range(runs):
            repo.discover(
                registry.types,
                self.limit,
                registry.concurrency_limits,
                rates=registry.rates,
                shared=registry.shared_rows,
                fair=registry.fair_types,
                bursts=registry.group_bursts,
            )
            repo.claim([0], registry)

    def _discover(
        self, repo: Repository, registry: Registry, report: Callable[..., Any], on_primary: bool
    ) -> list[int]:
        started = time.monotonic()
        self.batch = repo.discover(
            registry.types,
            self.limit,
            registry.concurrency_limits,
            on_primary=on_primary,
            rates=registry.rates,
            shared=registry.shared_rows,
            fair=registry.fair_types,
            bursts=registry.group_bursts,
        )
        self.limit = self.widened(time.monotonic() - started)
        self.retry_in = repo.wake_in_s
        if repo.sweep_in_s is not None:  # a task expires: when the supervisor sweeps next
            report("sweep", repo.sweep_in_s)
        return self.batch

    def widened(self, took_s: float) -> int:
        """What the next discovery asks for, after one that took `took_s`."""
        wanted = math.ceil(took_s / self.budget_s) if self.budget_s > 0 else self.base
        return min(max(self.base, wanted), self.base * MAX_WIDEN)

    def _claim(self, repo: Repository, registry: Registry) -> Claimed | None:
        # A claim is offered the head, a discovery's healthy size at most: a widened batch
        # would otherwise put a thousand ids in every claim's array. When every one of
        # them is gone, the next head is tried before discovering again.
        while self.batch:
            head = self.batch[: self.base]
            claimed = repo.claim(head, registry)
            if claimed is not None:
                self.consumed(claimed)
                return claimed
            self.batch = self.batch[len(head) :]
        return None
