"""The dashboard's settings (SLOTD_DASHBOARD_*): where it listens, who may look, whether it
may change anything. Read-only and loopback-only unless said otherwise."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from slotd.config import parse_duration
from slotd.errors import ConfigError

DEFAULT_ADDR = "127.0.0.1:8080"


@dataclass(frozen=True)
class DashboardSettings:
    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None
    actions: bool = False
    lease_margin: timedelta = timedelta(seconds=30)
    statement_timeout: timedelta = timedelta(seconds=5)
    # How often an open page asks for its live parts again (None: never, pages are
    # snapshots). Each ask is one page's statements in one short transaction; a tab out of
    # sight does not ask (see static/dashboard.js), and asks for the same page within
    # half the interval share one read (app.Dashboard.read_live).
    refresh: timedelta | None = timedelta(seconds=5)

    @property
    def authenticated(self) -> bool:
        return bool(self.token or self.basic_user)

    @classmethod
    def from_env(cls, lease_margin: timedelta = timedelta(seconds=30)) -> DashboardSettings:
        token = os.environ.get("SLOTD_DASHBOARD_TOKEN") or None
        if token is not None and len(token) < 16:
            raise ConfigError("bad SLOTD_DASHBOARD_TOKEN: use at least 16 characters")
        user = password = None
        basic = os.environ.get("SLOTD_DASHBOARD_BASIC_AUTH") or None
        if basic is not None:
            user, sep, password = basic.partition(":")
            if not sep or not user or not password:
                raise ConfigError("bad SLOTD_DASHBOARD_BASIC_AUTH: write it as user:password")
        raw = (os.environ.get("SLOTD_DASHBOARD_ACTIONS") or "off").strip().lower()
        if raw not in ("on", "off"):
            raise ConfigError(f"bad SLOTD_DASHBOARD_ACTIONS {raw!r}: use on or off")
        timeout = os.environ.get("SLOTD_DASHBOARD_STATEMENT_TIMEOUT") or "5s"
        refresh = _refresh(os.environ.get("SLOTD_DASHBOARD_REFRESH") or "5s")
        return cls(
            token=token,
            basic_user=user,
            basic_password=password,
            actions=raw == "on",
            lease_margin=lease_margin,
            statement_timeout=parse_duration(timeout, name="SLOTD_DASHBOARD_STATEMENT_TIMEOUT"),
            refresh=refresh,
        )


MIN_REFRESH = timedelta(seconds=1)


def _refresh(text: str) -> timedelta | None:
    """`off`, or a duration of a second or more (a faster page would cost the database more
    than it shows a person)."""
    if text.strip().lower() == "off":
        return None
    every = parse_duration(text, name="SLOTD_DASHBOARD_REFRESH")
    if every < MIN_REFRESH:
        raise ConfigError(f"bad SLOTD_DASHBOARD_REFRESH {text!r}: use 1s or more, or off")
    return every


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad --addr {addr!r}: write it as HOST:PORT, like {DEFAULT_ADDR}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Every address `host` names is a loopback one (a name is resolved: 'localhost' is
    fine, a name that also resolves to a public address is not)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
