"""SLOTD_FAULT_*: each kind fires at its probability, is logged and counted, and needs the
explicit opt-in."""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import sys
import textwrap
import time

import pytest

from slotd.config import Faults, Settings
from slotd.dev.faults import CRASH_STATUS, InjectedFault, Injector, refuse_unless_allowed
from slotd.errors import ConfigError


class Recorder:
    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.sleeps: list[float] = []
        self.exits: list[int] = []

    def injector(self, faults: Faults, seed: int = 7) -> Injector:
        return Injector(
            faults,
            random.Random(seed),
            self.kinds.append,
            sleep=self.sleeps.append,
            exit=self.exits.append,
        )


def test_no_faults_configured_never_fires() -> None:
    rec = Recorder()
    inj = rec.injector(Faults())
    for _ in range(1000):
        inj.before_handler()
        assert inj.lose_settlement() is False
    assert rec.kinds == rec.sleeps == rec.exits == []


def test_error_fires_at_its_probability_and_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorder()
    inj = rec.injector(Faults(error=0.25))
    raised = 0
    with caplog.at_level(logging.WARNING, logger="slotd.faults"):
        for _ in range(2000):
            try:
                inj.before_handler()
            except InjectedFault:
                raised += 1
    assert 400 < raised < 600  # 0.25 of 2000, well inside the binomial spread
    assert rec.kinds == ["error"] * raised
    logged = [r for r in caplog.records if r.getMessage().startswith("injected fault: error")]
    assert len(logged) == raised
    assert all(r.levelno == logging.WARNING for r in logged)


def test_same_seed_same_faults() -> None:
    def run(seed: int) -> list[str]:
        rec = Recorder()
        inj = rec.injector(Faults(error=0.3, latency=0.3, lost_settlement=0.3), seed)
        for _ in range(200):
            try:
                inj.before_handler()
            except InjectedFault:
                pass
            inj.lose_settlement()
        return rec.kinds

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_latency_sleeps_the_configured_seconds_before_the_handler() -> None:
    rec = Recorder()
    inj = rec.injector(Faults(latency=1.0, latency_seconds=2.5))
    inj.before_handler()
    assert rec.sleeps == [2.5]
    assert rec.kinds == ["latency"]


def test_latency_really_delays_with_the_default_sleep() -> None:
    inj = Injector(Faults(latency=1.0, latency_seconds=0.05), random.Random(1))
    started = time.monotonic()
    inj.before_handler()
    assert time.monotonic() - started >= 0.05


def test_latency_then_error_in_one_call() -> None:
    rec = Recorder()
    inj = rec.injector(Faults(latency=1.0, error=1.0, latency_seconds=0.1))
    with pytest.raises(InjectedFault):
        inj.before_handler()
    assert rec.kinds == ["latency", "error"]


def test_crash_exits_before_anything_else() -> None:
    rec = Recorder()
    inj = rec.injector(Faults(crash=1.0, latency=1.0, error=1.0))
    inj.before_handler()  # exit is replaced, so the call returns
    assert rec.exits == [CRASH_STATUS]
    assert rec.kinds == ["crash"]
    assert rec.sleeps == []


def test_crash_really_ends_the_process_with_status_70() -> None:
    code = textwrap.dedent(
        """
        import logging, random, sys
        from slotd.config import Faults
        from slotd.dev.faults import Injector
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        Injector(Faults(crash=1.0), random.Random(0), lambda kind: print("counted", kind,
                 flush=True)).before_handler()
        print("survived", flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == CRASH_STATUS
    assert "counted crash" in proc.stdout
    assert "survived" not in proc.stdout
    assert "injected fault: crash" in proc.stderr


def test_lost_settlement_is_reported() -> None:
    rec = Recorder()
    inj = rec.injector(Faults(lost_settlement=1.0))
    assert inj.lose_settlement() is True
    assert rec.kinds == ["lost_settlement"]


def test_a_failing_counter_does_not_become_a_handler_error() -> None:
    def broken(kind: str) -> None:
        raise RuntimeError("metrics down")

    inj = Injector(Faults(lost_settlement=1.0), random.Random(0), broken)
    assert inj.lose_settlement() is True


def test_refused_without_allow_faults() -> None:
    settings = Settings(faults=Faults(crash=0.1))
    with pytest.raises(ConfigError, match="SLOTD_FAULT_\\* set but SLOTD_ALLOW_FAULTS is not 1"):
        refuse_unless_allowed(settings)
    with pytest.raises(ConfigError):
        Injector.from_settings(settings)


def test_allowed_with_the_opt_in_and_nothing_to_do_without_faults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refuse_unless_allowed(Settings())  # no faults: nothing to allow
    assert Injector.from_settings(Settings()) is None
    monkeypatch.setenv("SLOTD_FAULT_ERROR", "0.5")
    monkeypatch.setenv("SLOTD_FAULT_LATENCY_SECONDS", "250ms")
    with pytest.raises(ConfigError):
        refuse_unless_allowed(Settings.from_env())
    monkeypatch.setenv("SLOTD_ALLOW_FAULTS", "1")
    settings = Settings.from_env()
    refuse_unless_allowed(settings)
    inj = Injector.from_settings(settings)
    assert inj is not None
    assert inj.faults.error == 0.5
    assert inj.faults.latency_seconds == 0.25


def test_forked_runners_do_not_fault_in_step() -> None:
    inj = Injector(Faults(error=0.5))
    parent_rng = inj.rng
    inj._pid = -1  # as seen from a forked child
    with contextlib.suppress(InjectedFault):
        inj.before_handler()
    assert inj.rng is not parent_rng
    seeded = Injector(Faults(error=0.5), random.Random(3))
    fixed_rng = seeded.rng
    seeded._pid = -1
    with contextlib.suppress(InjectedFault):
        seeded.before_handler()
    assert seeded.rng is fixed_rng  # a chosen seed stays reproducible
