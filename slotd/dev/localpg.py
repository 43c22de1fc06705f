"""Start and stop a private PostgreSQL in a directory of our own: the embedded default and
the test harness both stand on this.

PostgreSQL refuses to run as root, so as root the server runs as an unprivileged user (the
system's `postgres` account, or `nobody` when there is none) in a directory that user owns;
nothing outside that directory changes mode or owner."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from slotd.errors import SlotdError

SERVER_USER = "slotd"


class LocalPostgresError(SlotdError):
    pass


def find_bindir() -> Path:
    """The newest PostgreSQL server binaries on this host."""
    override = os.environ.get("SLOTD_PG_BINDIR")
    candidates = [override] if override else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    candidates += ["/usr/local/pgsql/bin", "/opt/homebrew/bin", "/usr/local/bin", "/usr/bin"]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        if (
            candidate
            and (Path(candidate) / "initdb").exists()
            and (Path(candidate) / "pg_ctl").exists()
        ):
            return Path(candidate)
    raise LocalPostgresError(
        "no PostgreSQL server binaries found (initdb, pg_ctl): install them "
        "(apt-get install -y postgresql) or set SLOTD_DATABASE_URL to a real server"
    )


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise LocalPostgresError("running as root and no unprivileged user to run PostgreSQL as")


@dataclass
class LocalPostgres:
    """One server: its data in `root/data`, its socket in `socket_dir`, its log beside it."""

    root: Path
    socket_dir: Path
    port: int = 5432
    fast: bool = False  # tests and benchmarks' throwaway servers: no fsync
    # Further server options, e.g. "-c shared_preload_libraries=pg_stat_statements" for the
    # benchmark; passed after our own so they win.
    extra_options: list[str] = field(default_factory=list)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@/{dbname}?host={self.socket_dir}&port={self.port}"

    def _cmd(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        user = _run_as()
        preexec = None
        if user is not None:
            uid, gid = user.pw_uid, user.pw_gid

            def preexec() -> None:
                os.setgid(gid)
                os.setgroups([])
                os.setuid(uid)

        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            preexec_fn=preexec,
            env=env,
            cwd="/",
            check=False,
        )
        if check and proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise LocalPostgresError(f"{Path(args[0]).name} failed: {' | '.join(tail)}")
        return proc

    def _own(self, path: Path) -> None:
        user = _run_as()
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if user is not None:
            os.chown(path, user.pw_uid, user.pw_gid)
            # The server user must reach its own directories; the parents we created are
            # ours to open up, and only those.
            os.chmod(path, 0o700)

    @property
    def initialized(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def init(self) -> None:
        bindir = find_bindir()
        self._own(self.root)
        self._own(self.socket_dir)
        args = [
            str(bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            SERVER_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]
        if self.fast:
            args.append("--no-sync")
        self._cmd(args)

    def running(self) -> bool:
        if not self.initialized:
            return False
        proc = self._cmd([str(find_bindir() / "pg_ctl"), "-D", str(self.datadir), "status"], False)
        return proc.returncode == 0

    def start(self, timeout: float = 60.0) -> None:
        if not self.initialized:
            self.init()
        if self.running():
            return
        self._own(self.socket_dir)
        options = [
            f"-p {self.port}",
            f"-k {self.socket_dir}",
            "-c listen_addresses=''",
            "-c max_connections=300",
            "-c shared_buffers=128MB",
        ]
        if self.fast:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        options += self.extra_options
        self._cmd(
            [
                str(find_bindir() / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-o",
                " ".join(options),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ]
        )

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._cmd([str(find_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@contextmanager
def scratch(prefix: str = "slotd-", port: int = 5432, fast: bool = True) -> Iterator[LocalPostgres]:
    """A throwaway server in a fresh temporary directory, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)  # as root the server runs as another user, who must pass through
    server = LocalPostgres(root=root / "pg", socket_dir=root / "sock", port=port, fast=fast)
    try:
        server.start()
        yield server
    finally:
        server.stop("immediate")
        # A test session's server holds a database per test: thousands of files, whose
        # removal on a busy disk outlasted pytest's timeout on the session's last test. A
        # detached child removes them; the caller's exit does not wait on the disk.
        subprocess.Popen(
            ["rm", "-rf", "--", str(root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
