"""The systemd notify protocol (sd_notify(3)), in the few lines it takes.

Our own rather than the `sdnotify` package: that one dates from 2017 and swallows every error
without a trace, and the protocol is one datagram per message. What we keep from it is the rule
that telling systemd must never break the daemon: a full socket buffer or a vanished socket is
logged at debug and reported as False, never raised into the supervisor loop.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("slotd.sdnotify")  # the name it had as slotd/sdnotify.py


def _address(raw: str) -> str | bytes | None:
    if raw.startswith("@"):
        # An abstract socket: systemd writes the leading NUL as "@" in the environment.
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    # Relative paths and vsock addresses are not something systemd hands a service unit; refusing
    # them beats sending READY=1 to a file in whatever the current directory happens to be.
    return None


def notify(*lines: str) -> bool:
    """Send `lines` (e.g. "READY=1", "STATUS=4 slots") as one message to $NOTIFY_SOCKET.

    Returns True when the datagram was sent, False when there is no socket to tell (not run by
    systemd, or NotifyAccess does not reach us) or sending failed.
    """
    raw = os.environ.get("NOTIFY_SOCKET")
    if not raw or not lines:
        return False
    address = _address(raw)
    if address is None:
        log.debug("sd_notify: unsupported NOTIFY_SOCKET %r", raw)
        return False
    message = "\n".join(lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError as exc:
        log.debug("sd_notify to %r failed: %s", raw, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 heartbeats when systemd's watchdog is armed for us, else None.

    systemd kills the service when no heartbeat arrives within WATCHDOG_USEC; sd_watchdog_enabled(3)
    recommends pinging at half that, so one late loop iteration does not cost a restart.
    WATCHDOG_PID, when set, names the process the watchdog is for: a child that inherited the
    environment (a slot, a runner) must not start heartbeating on the supervisor's behalf.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    try:
        if pid and int(pid) != os.getpid():
            return None
        value = int(usec)
    except ValueError:
        log.debug("sd_notify: ignoring malformed WATCHDOG_USEC=%r WATCHDOG_PID=%r", usec, pid)
        return None
    if value <= 0:
        return None
    return value / 1_000_000 / 2
