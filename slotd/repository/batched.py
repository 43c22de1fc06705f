"""Batched claims and settlements (#43, sql/queries_batched.sql): several tasks claimed in
one statement, several plain successes settled in one statement, every task under its own
lease token and every settlement fenced on it. When a slot may batch, and what it may
batch, is the lifecycle's rule (slotd/lifecycle/__init__.py, "batched")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from slotd.registry import Registry
from slotd.repository.named import _sql
from slotd.repository.queue import Claimed, QueueProtocol, array_literal, id_array


def lease_tokens(n: int) -> list[str]:
    """n lease tokens, 128 random bits each from the OS's strong source (as gen_random_uuid
    draws them), as the 32 hex digits PostgreSQL reads as a uuid."""
    raw = os.urandom(16 * n).hex()
    return [raw[i : i + 32] for i in range(0, 32 * n, 32)]


class BatchedQueue(QueueProtocol):
    def batchable(self, registry: Registry) -> list[str]:
        """The types a batched claim may take: those without a concurrency limit, a rate,
        a shared limit (#39) or fair turns (#39: a fair claim stamps its group's turn, one
        row at a time); see claim_picked_many."""
        shape = self._shape(registry)
        cached = self._batchable
        if cached is None or cached[0] is not shape:
            locked = set(shape.locked) | set(shape.shared_keys) | set(shape.fair)
            cached = self._batchable = (shape, [t for t in shape.types if t not in locked])
        return cached[1]

    _batchable: tuple[Any, list[str]] | None = None

    def _many_params(
        self, ids: Sequence[int], registry: Registry, tokens: Sequence[str]
    ) -> dict[str, Any]:
        shape = self._shape(registry)
        return {
            "ids": id_array(ids),
            "types": shape.literals["types"],
            "ceilings_s": shape.literals["ceilings_s"],
            "max_attempts": shape.literals["max_attempts"],
            "batchable": array_literal(self.batchable(registry)),
            "n": len(tokens),
            "lease_tokens": array_literal(tokens),
            "margin_s": self.lease_margin.total_seconds(),
        }

    def claim_many(
        self, ids: Sequence[int], registry: Registry, tokens: Sequence[str]
    ) -> list[Claimed]:
        """Up to len(tokens) of `ids`, each leased under its own token, in the candidates'
        order."""
        if not ids or not tokens:
            return []
        _, rows = self._write("claim_many", self._many_params(ids, registry, tokens))
        return _in_order([self.remember_lapse(Claimed(*row)) for row in rows], ids)

    def dequeue_many_and_claim(
        self,
        done: Sequence[Claimed],
        ids: Sequence[int],
        registry: Registry,
        tokens: Sequence[str],
    ) -> tuple[set[int], list[Claimed]]:
        """Delete the plain successes `done`, each fenced on its own token, and claim up to
        len(tokens) of `ids`, in one statement: (the ids deleted, the claims in the
        candidates' order). A success not deleted was refused: the lease is gone, or the
        row gained dependants since its claim (the caller settles it alone)."""
        params = self._many_params(ids, registry, tokens)
        params["done_ids"] = id_array([c.id for c in done])
        params["done_tokens"] = "{" + ",".join(c.token.hex for c in done) + "}"
        _, rows = self._write("dequeue_many_claim_many", params)
        dequeued = set(rows[0][0]) if rows else set()
        claims = [self.remember_lapse(Claimed(*row[1:])) for row in rows if row[1] is not None]
        return dequeued, _in_order(claims, ids)

    def held_leases(self, tokens: Sequence[str]) -> list[Claimed]:
        """The live leases under `tokens` (a batched claim's, after its answer was lost)."""
        if not tokens:
            return []
        rows = self.write.execute(
            _sql("held_leases", self.schema), {"tokens": array_literal(tokens)}
        ).fetchall()
        return [Claimed(*row) for row in rows]


def _in_order(claims: list[Claimed], ids: Sequence[int]) -> list[Claimed]:
    place = {task_id: i for i, task_id in enumerate(ids)}
    return sorted(claims, key=lambda c: place.get(c.id, len(place)))
