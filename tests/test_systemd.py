"""The systemd units in systemd/, checked by systemd's own parser and its security analyzer.

`systemd-analyze verify` exits 0 on a typo (`Type=notifyy`, an unknown key) and only warns on
stderr, so every check here insists on an empty stderr. It also refuses a unit whose ExecStart
binary is missing, so the units are verified as copies whose /usr/local/bin/slotd points at the
`slotd` console script of this environment; nothing else in them changes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS_DIR = ROOT / "systemd"
UNITS = ("slotd.service", "slotd@.service", "slotd-migrate.service", "slotd-migrate@.service")
INSTALLED_SLOTD = "/usr/local/bin/slotd"
# Measured 1.2 ("OK") with systemd 252 on Debian 12; the margin absorbs scoring changes in other
# systemd versions, while losing e.g. ProtectSystem= or the syscall filter still trips it.
MAX_EXPOSURE = 1.5

ANALYZE = shutil.which("systemd-analyze")
SLOTD = shutil.which("slotd")

pytestmark = [
    pytest.mark.skipif(
        ANALYZE is None, reason="systemd-analyze is not installed (Debian: systemd)"
    ),
    pytest.mark.skipif(SLOTD is None, reason="the slotd console script is not installed"),
]


def unit_text(name: str) -> str:
    return (UNITS_DIR / name).read_text()


def directives(name: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit_text(name).splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.fixture(scope="module")
def unit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # All units in one directory: verify follows Requires= and fails when the migration unit a
    # worker depends on does not exist.
    assert SLOTD is not None
    out = tmp_path_factory.mktemp("units")
    for name in UNITS:
        text = unit_text(name)
        assert f"ExecStart={INSTALLED_SLOTD} " in text, name
        (out / name).write_text(
            text.replace(f"ExecStart={INSTALLED_SLOTD} ", f"ExecStart={SLOTD} ")
        )
    return out


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("name", UNITS)
def test_unit_passes_systemd_analyze_verify_without_a_warning(unit_dir: Path, name: str) -> None:
    proc = analyze("verify", str(unit_dir / name))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr


def test_verify_catches_a_typo_so_the_check_above_means_something(unit_dir: Path) -> None:
    broken = unit_dir / "typo" / "slotd.service"
    broken.parent.mkdir()
    for name in UNITS:
        shutil.copy(unit_dir / name, broken.parent / name)
    broken.write_text((unit_dir / "slotd.service").read_text().replace("Type=notify", "Type=nfy"))
    proc = analyze("verify", str(broken))
    assert "nfy" in proc.stderr


@pytest.mark.parametrize("name", UNITS)
def test_unit_security_exposure_stays_low(unit_dir: Path, name: str) -> None:
    proc = analyze("security", "--offline=true", str(unit_dir / name))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) <= MAX_EXPOSURE, proc.stdout


@pytest.mark.parametrize("name", ["slotd.service", "slotd@.service"])
def test_worker_unit_hands_sigterm_to_the_supervisor_and_waits_past_the_grace(name: str) -> None:
    unit = directives(name)
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]
    assert unit["KillMode"] == ["mixed"]
    assert unit["KillSignal"] == ["SIGTERM"]
    assert unit["WatchdogSec"] == ["30s"]
    # SLOTD_SHUTDOWN_GRACE defaults to 25 s; leases are released after the handlers stop.
    stop = unit["TimeoutStopSec"][0]
    assert stop.endswith("s") and int(stop[:-1]) >= 25 + 15
    assert unit["Restart"] == ["on-failure"]
    assert unit["StartLimitBurst"] and unit["StartLimitIntervalSec"]
    assert unit["ExecStart"] == [f"{INSTALLED_SLOTD} run"]


@pytest.mark.parametrize(
    ("worker", "migration", "env_file"),
    [
        ("slotd.service", "slotd-migrate.service", "/etc/slotd/slotd.env"),
        ("slotd@.service", "slotd-migrate@%i.service", "/etc/slotd/%i.env"),
    ],
)
def test_worker_requires_and_follows_its_migration(
    worker: str, migration: str, env_file: str
) -> None:
    unit = directives(worker)
    assert migration in unit["Requires"]
    assert migration in unit["After"][0].split()
    assert unit["EnvironmentFile"] == [env_file]
    migrate = directives(migration.replace("%i", ""))
    assert migrate["Type"] == ["oneshot"]
    assert migrate["RemainAfterExit"] == ["yes"]
    assert migrate["EnvironmentFile"] == [env_file]
    # Lock waits bounded and retried for 4 minutes, inside the unit's 5-minute start limit:
    # the unit fails with slotd's own line, not systemd's timeout kill.
    assert migrate["ExecStart"] == [f"{INSTALLED_SLOTD} migrate --wait 4m"]
    assert migrate["TimeoutStartSec"] == ["5min"]


@pytest.mark.parametrize("name", UNITS)
def test_unit_runs_unprivileged_and_sandboxed(name: str) -> None:
    unit = directives(name)
    assert unit["User"] == ["slotd"] and unit["Group"] == ["slotd"]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert unit[key] == [value], key
