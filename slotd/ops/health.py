"""/healthz and /readyz: what the supervisor's state says about this replica; and the metrics
server that answers them beside /metrics.

They are asked on the metrics server's thread, so they read a `Vitals`, a small copy of the
supervisor's state taken when asked, and never the supervisor itself. Health is whether the
replica should be restarted (a stalled loop, missing slots, a runner SIGKILL did not end);
readiness is whether it takes work (listening, every slot up, not stopping)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from slotd.config import DEFAULT_METRICS_ADDR, Settings, format_duration
from slotd.registry import Registry

log = logging.getLogger("slotd.supervisor")


@dataclass(frozen=True)
class Vitals:
    slots_up: int
    slots_wanted: int
    stuck: list[int]  # slots holding a runner that SIGKILL did not end
    loop_seen: float  # time.monotonic() at the loop's last pass
    poll_interval: timedelta
    stopping: bool
    listening: bool
    announced_ready: bool
    notify_reaches: bool


def health(v: Vitals) -> tuple[bool, str]:
    alive = v.slots_up
    stale = time.monotonic() - v.loop_seen
    if stale > 3 * v.poll_interval.total_seconds() + 5:
        return False, f"supervisor loop stalled for {stale:.0f}s"
    if alive < v.slots_wanted and not v.stopping:
        return False, f"{alive}/{v.slots_wanted} slots up"
    if v.stuck:
        return False, f"slots {v.stuck} hold a runner that SIGKILL did not end"
    return True, f"{alive}/{v.slots_wanted} slots up"


def readiness(v: Vitals) -> tuple[bool, str]:
    if v.stopping:
        return False, "stopping"
    if not v.listening:
        return False, "not listening"
    if not v.announced_ready:
        return False, "slots starting"
    if not v.notify_reaches:
        # Still serving, on the ticker: ready, with the reason an operator needs.
        poll = format_duration(v.poll_interval)
        return True, f"polling every {poll}: NOTIFY does not reach the LISTEN connection"
    return True, "listening"


def serve_metrics(
    settings: Settings, registry: Registry, read_url: str, vitals: Callable[[], Vitals]
) -> tuple[Any, Any]:
    """Start the metrics server (its own thread) when SLOTD_METRICS_ADDR asks for one: the
    replica's Metrics and the server, or (None, None)."""
    addr = settings.metrics_addr
    if addr in ("", "off", "none"):
        return None, None
    # Not set: the default address, or a free port beside it when another replica (a second
    # `slotd run`, `slotd examples demo` beside a worker) on this host holds it. Set and
    # taken: a refusal, since a scraper or a probe was pointed at exactly that address.
    fallback = addr is None
    addr = addr or DEFAULT_METRICS_ADDR
    import prometheus_client

    from slotd.ops import metrics, metrics_server

    # *_created series double the exposition and nobody alerts on them.
    prometheus_client.disable_created_metrics()
    replica_metrics = metrics.Metrics(
        settings.slots,
        registry.types,
        metrics.db_gauge_source(
            read_url,
            limits=registry.concurrency_limits,
            priority_step=settings.priority_step,
            prepare=settings.prepare,
        ),
        limits=registry.concurrency_limits,
    )
    server = metrics_server.serve(
        addr,
        replica_metrics,
        lambda: health(vitals()),
        lambda: readiness(vitals()),
        fallback=fallback,
    )
    log.info("metrics on %s/metrics", server.url)
    return replica_metrics, server
