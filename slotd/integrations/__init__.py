"""slotd's own optional integrations, each loaded once when its library is importable and
never imported otherwise: tracing (slotd.tracing) with opentelemetry-api."""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotd.middleware import Middleware

_UNSET: Any = object()
_tracing: Any = _UNSET
# The first load is made by one thread, the others wait for its answer. Two threads' first
# calls at once (`slotd run` loading the app while a thread enqueues, a threaded server's
# first requests) would each import slotd.tracing; when that import fails (no
# opentelemetry), CPython can hand the second thread the module the first just dropped, and
# slotd.enqueue raised "cannot import name 'tracing' from 'slotd'" (found by the public
# job-queue bench: it killed a replica's producer thread). A fork's child gets a fresh lock:
# one held by a thread of the parent would never be released there.
_loading = threading.Lock()


def _fresh_lock() -> None:
    global _loading
    _loading = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock)


def tracing() -> ModuleType | None:
    """slotd.tracing, or None without opentelemetry-api (`pip install 'slotd[otel]'`)."""
    global _tracing
    if _tracing is _UNSET:
        with _loading:
            if _tracing is _UNSET:
                try:
                    from slotd.integrations import otel as module
                except ImportError as exc:
                    if not (exc.name or "").startswith("opentelemetry"):
                        raise  # slotd's own bug, not a missing extra
                    module = None
                _tracing = module
    return _tracing


def middleware() -> tuple[Middleware, ...]:
    """slotd's own middleware with something to do now, outermost of every chain: the
    attempt's span first, so the application's (an error reporter, a tenant) runs inside
    it. Asked before every attempt (a tracer provider may be set at any time), so cheap."""
    found = _tracing if _tracing is not _UNSET else tracing()
    return () if found is None else found.middleware()


def runner_exit(timeout: float) -> None:
    """A runner is about to end (os._exit, so no atexit): hand over what is buffered. Only
    where the application uses OpenTelemetry at all: never an import just to exit."""
    if "opentelemetry.trace" not in sys.modules:
        return
    found = tracing()
    if found is not None:
        found.flush(timeout)
