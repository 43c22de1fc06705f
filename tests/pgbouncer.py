"""A real PgBouncer in front of a test server, on a loopback TCP port: what production puts
between slotd and PostgreSQL. The test server listens on a unix socket only, which is how
PgBouncer reaches it.

Debian's PgBouncer refuses to run as root, so as root it runs as the server's own user, with
its ini file in a directory that user can read."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from slotd.dev.localpg import SERVER_USER, LocalPostgres, _run_as


def binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    def __init__(self, server: LocalPostgres, mode: str, pool_size: int = 4) -> None:
        self.server, self.mode, self.pool_size = server, mode, pool_size
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"slotd-pgbouncer-{mode}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{dbname}"

    def url_for(self, direct_url: str) -> str:
        """The pooled URL of the database a direct test URL names."""
        return self.url(psycopg.conninfo.conninfo_to_dict(direct_url)["dbname"])

    @property
    def logfile(self) -> Path:
        return self.root / "pgbouncer.log"

    def start(self) -> PgBouncer:
        user = _run_as()
        (self.root / "users.txt").write_text("")
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.server.socket_dir} port={self.server.port} user={SERVER_USER}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            f"auth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            "max_db_connections = 0\n"
            "server_reset_query = DISCARD ALL\n"
            f"logfile = {self.logfile}\n"
        )
        preexec = None
        if user is not None:
            os.chown(self.root, user.pw_uid, user.pw_gid)
            for path in self.root.iterdir():
                os.chown(path, user.pw_uid, user.pw_gid)
            uid, gid = user.pw_uid, user.pw_gid

            def preexec() -> None:
                os.setgid(gid)
                os.setgroups([])
                os.setuid(uid)

        exe = binary()
        assert exe is not None
        self.proc = subprocess.Popen(
            [exe, str(self.root / "pgbouncer.ini")],
            preexec_fn=preexec,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.logfile.read_text() if self.logfile.exists() else ""
                    raise RuntimeError(f"pgbouncer did not start: {log[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def pgbouncer(server: LocalPostgres, mode: str, pool_size: int = 4) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(server, mode, pool_size)
    try:
        yield bouncer.start()
    finally:
        bouncer.stop()
