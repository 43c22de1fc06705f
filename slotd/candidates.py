"""A slot's candidates: what its last discovery found, claimed from the head.

One discovery (on the read lane, a read: no attempt burnt) serves up to a batch of claims.
Every slot takes the candidates in the discovery's order (ordering key, then id): slots that
discovered the same rows all start at the head, and the claim's SKIP LOCKED (and its recheck
of a row leased meanwhile) gives each the first row nobody else holds, so nothing starts
before an older-keyed claimable task. A rotation per slot spread the contention, and started
lower-priority rows before the head of the queue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slotd.registry import Registry
from slotd.repository import Claimed, Repository


class Candidates:
    def __init__(self, discovery_batch: int, slots: int) -> None:
        self.batch: list[int] = []
        self.per_claim = discovery_batch
        self.limit = discovery_batch * slots
        # Seconds until a full rate window has room, from the last discovery (None: none
        # full): when a claim finds nothing, the next wake (slotd.wake.Tokens.retry_in).
        self.retry_in: float | None = None

    def next_claim(
        self, repo: Repository, registry: Registry, report: Callable[..., Any]
    ) -> Claimed | None:
        """Claim from what the last discovery found before discovering again."""
        if self.batch and (claimed := self._claim(repo, registry)) is not None:
            return claimed
        if not self._discover(repo, registry, on_primary=False):
            return None
        if (claimed := self._claim(repo, registry)) is not None:
            return claimed
        # Every candidate missed: other slots took them, or a lagging read lane offered rows
        # the primary already finished. One more look, on the primary (bounded: then the
        # normal path), so replica lag costs a round trip rather than a poll interval.
        if repo.has_read_lane:
            report("read_miss")
        if not self._discover(repo, registry, on_primary=True):
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

    def consumed(self, claimed: Claimed) -> None:
        # The claim takes the oldest claimable candidate, so every candidate before it was
        # already taken by another slot: drop those too rather than try them again.
        if claimed.id in self.batch:
            self.batch = self.batch[self.batch.index(claimed.id) + 1 :]

    def forget(self) -> None:
        self.batch = []

    def _discover(self, repo: Repository, registry: Registry, on_primary: bool) -> list[int]:
        self.batch = repo.discover(
            registry.types,
            self.limit,
            registry.concurrency_limits,
            on_primary=on_primary,
            rates=registry.rates,
        )
        self.retry_in = repo.rate_wait_s
        return self.batch

    def _claim(self, repo: Repository, registry: Registry) -> Claimed | None:
        claimed = repo.claim(self.batch, registry)
        if claimed is None:
            self.batch = []
        else:
            self.consumed(claimed)
        return claimed
