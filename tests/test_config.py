"""Settings that interact: the kill grace is derived from the margin unless it is set."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from slotd.config import Settings
from slotd.errors import ConfigError


def test_a_short_margin_alone_derives_a_shorter_kill_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLOTD_KILL_GRACE", raising=False)
    monkeypatch.setenv("SLOTD_LEASE_MARGIN", "3s")
    assert Settings.from_env().kill_grace == timedelta(seconds=1.5)
    monkeypatch.setenv("SLOTD_LEASE_MARGIN", "30s")
    assert Settings.from_env().kill_grace == timedelta(seconds=5)
    # Derived again when the margin changes later, not frozen at the first value.
    assert Settings().with_(lease_margin=timedelta(seconds=2)).kill_grace == timedelta(seconds=1)


def test_an_explicit_grace_is_kept_and_only_an_explicit_conflict_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLOTD_LEASE_MARGIN", "3s")
    monkeypatch.setenv("SLOTD_KILL_GRACE", "2s")
    assert Settings.from_env().kill_grace == timedelta(seconds=2)
    monkeypatch.setenv("SLOTD_KILL_GRACE", "5s")
    with pytest.raises(ConfigError, match=r"SLOTD_KILL_GRACE \(5s\) must be shorter"):
        Settings.from_env()


def test_the_command_line_refuses_a_conflicting_pair_in_one_line(tmp_path: object) -> None:
    env = {"SLOTD_LEASE_MARGIN": "3s", "SLOTD_KILL_GRACE": "5s", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "slotd", "status"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "SLOTD_KILL_GRACE (5s) must be shorter than SLOTD_LEASE_MARGIN (3s)" in done.stderr
