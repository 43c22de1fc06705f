"""The HTTP endpoints of one replica, served from a daemon thread of the supervisor: /metrics
(the replica's Metrics, metrics.py), /healthz and /readyz (the checks of
health.py, handed in as callables). Started by health.serve_metrics when
SLOTD_METRICS_ADDR asks for it."""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from slotd import db
from slotd.errors import ConfigError

if TYPE_CHECKING:
    from slotd.ops.metrics import Metrics

log = logging.getLogger("slotd.metrics")


def parse_addr(addr: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (all interfaces); port 0 picks a free one."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"bad metrics address {addr!r}: write it like 127.0.0.1:9464")
    host = host.strip("[]")
    return host, int(port)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    timeout = 60  # ...but an idle one must not pin a thread forever

    def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
        self._respond(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._respond(send_body=False)

    def _respond(self, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        app = self.server.app
        if path == "/metrics":
            try:
                status, ctype, body = 200, CONTENT_TYPE_LATEST, app.metrics.render()
            except Exception as exc:
                log.exception("rendering /metrics failed")
                status, ctype = 500, "text/plain; charset=utf-8"
                body = f"error: {db.redact(str(exc))}\n".encode()
        elif path in ("/healthz", "/readyz"):
            check = app.health if path == "/healthz" else app.ready
            try:
                ok, why = check()
            except Exception as exc:
                ok, why = False, f"check failed: {exc}"
            status, ctype = (200 if ok else 503), "text/plain; charset=utf-8"
            body = (db.redact(why or ("ok" if ok else "not ok")).strip() + "\n").encode()
        else:
            status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Every scrape would be a log line; failures are logged where they happen.
        pass


class _App:
    def __init__(
        self,
        metrics: Metrics,
        health: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]],
    ) -> None:
        self.metrics, self.health, self.ready = metrics, health, ready


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a hung scraper never holds the supervisor's exit
    app: _App


class Server:
    """The metrics and health endpoints, served from a daemon thread."""

    def __init__(self, httpd: _HTTPServer) -> None:
        self._httpd = httpd
        address = httpd.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.5}, name="slotd-metrics"
        )
        self._thread.daemon = True
        self._thread.start()

    def fileno(self) -> int:
        """The listening socket, which a forked child closes (it must not hold the port)."""
        return self._httpd.fileno()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve(
    addr: str,
    metrics: Metrics,
    health: Callable[[], tuple[bool, str]],
    ready: Callable[[], tuple[bool, str]],
    *,
    fallback: bool = False,
) -> Server:
    """Serve /metrics, /healthz and /readyz on `addr`; `Server.port` is the bound port.

    An address that cannot be bound is a ConfigError (one line, exit 2): a scraper or a
    probe points at exactly that address, so serving elsewhere would hide the replica. With
    `fallback` (the default address, not chosen by anyone) a taken port gives way to a free
    one on the same host, said in one warning: two replicas on one host, or `slotd examples
    demo` beside a worker, run without settings."""
    host, port = parse_addr(addr)
    server_class = _HTTPServer
    if ":" in host:

        class _V6(_HTTPServer):
            address_family = socket.AF_INET6

        server_class = _V6
    try:
        httpd = server_class((host, port), _Handler)
    except OSError as exc:
        if not (fallback and exc.errno == errno.EADDRINUSE):
            raise ConfigError(
                f"cannot serve metrics on {addr}: {exc.strerror or exc}; set "
                "SLOTD_METRICS_ADDR (or --metrics-addr) to a free host:port, port 0 for "
                "any free one, or off"
            ) from None
        httpd = server_class((host, 0), _Handler)
        chosen = f"[{host}]" if ":" in host else host
        log.warning(
            "metrics: %s is in use (another slotd on this host?); serving /metrics, /healthz "
            "and /readyz on %s:%d instead (SLOTD_METRICS_ADDR chooses)",
            addr,
            chosen,
            httpd.server_address[1],
        )
    httpd.app = _App(metrics, health, ready)
    return Server(httpd)
