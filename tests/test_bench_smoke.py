"""The benchmark must not rot: run its slotd part at toy size and check that it produced
figures. Speed is never asserted here; the numbers at this size mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Minutes, not seconds: deselected from the default run (pyproject's addopts), run by
# .ci/run as `python3 -m pytest -q -m bench`.
pytestmark = pytest.mark.bench


# `--quick`: every step of the bench at small counts, peers and pgbench included, so a change
# that breaks any of them (the pgbench floor stopped binding its parameters once, unseen)
# fails here. The first run on a machine also builds the peers' venvs (oban's compiles
# erlpack): minutes. The bound only has to catch a hang.
@pytest.mark.timeout(1800)
def test_bench_quick_runs_every_step_and_writes_figures(tmp_path: Path) -> None:
    results, raw = tmp_path / "RESULTS.md", tmp_path / "raw.json"
    results.write_text("## an earlier run\n")
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "run.py"), "--quick",
           "--results", str(results), "--json", str(raw)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1740)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    figures = json.loads(raw.read_text())["results"]
    for section in ("drain", "latency", "idle", "claim_latency", "enqueue", "memory",
                    "watchdog", "write_variants", "pgbench"):  # fmt: skip
        assert figures.get(section), section
    for runs in figures["drain"].values():
        for run in runs:
            assert run["tasks_per_s"] > 0 and run["pg_cpu_us_per_task"] > 0, run
            assert run["workers_cpu_us_per_task"] > 0, run
    for floor in figures["pgbench"].values():  # the one-statement floor ran and drained
        assert floor["tasks_per_s"] > 0 and floor["pg_cpu_us_per_task"] > 0, floor
        assert floor["left"] <= 4, floor
    # Every peer either drained, with its CPU per task, or says why it could not be installed.
    peers, skipped = figures.get("peers", {}), figures.get("peers_skipped", {})
    for system in ("procrastinate", "pgqueuer", "oban"):
        ran = [v for label, v in peers.items() if label.startswith(system)]
        assert ran or skipped.get(system), system
        assert all(v["tasks_per_s"] > 0 and v["pg_cpu_us_per_task"] > 0 for v in ran), ran
    assert all(lat["n"] > 0 for lat in figures["latency"].values())
    text = results.read_text()
    assert "### 1. Drain" in text and "### 7. Watchdog" in text and "floor" in text

    assert text.startswith("## an earlier run\n")  # runs are appended, never replaced


def test_peer_script_runs_without_any_peer_installed() -> None:
    # peers.py runs under two venvs (oban's is Python >= 3.12): a peer imported at module
    # level would break the others' interpreters.
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "peers.py"), "nonsense"]
    proc = subprocess.run(cmd, cwd="/", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "unknown command 'nonsense'" in proc.stderr, proc.stderr


def test_cpu_per_task_bench_reports_every_role() -> None:
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "cpu_per_task.py"), "--n", "300",
           "--rounds", "1", "--slots", "2"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| bench.")]
    assert [row.split(" | ")[0] for row in rows] == ["| bench.noop", "| bench.async_noop"]
    for row in rows:
        cells = [c.strip().replace(",", "") for c in row.strip("| ").split(" | ")[1:]]
        rate, own, supervisor, slots, runners, backends, other = map(float, cells)
        # CPU times tick in 10 ms: at toy size only the big shares are surely above zero.
        assert rate > 0 and own >= supervisor + slots + runners - 3 and slots > 0, row
        assert backends > 0, row


@pytest.mark.timeout(300)  # a minute of soak by design, plus a server's and a replica's start
def test_soak_runs_a_minute_and_reports_it() -> None:
    # The CI variant of tests/bench/soak.py: one minute at a trickle, every column filled.
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "soak.py"), "--minutes", "1",
           "--rate", "20", "--slots", "2"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| 1 |")]
    cells = [c.strip().replace(",", "") for c in row.strip("| ").split(" | ")]
    assert float(cells[1]) > 0 and float(cells[3]) > 0, row  # tasks/s, start p99
    assert "Last minute vs first" in proc.stdout


def test_runtime_schedules_bench_fires_from_two_replicas(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "runtime_schedules.py"), "--n", "200",
           "--seconds", "3", "--replicas", "2", "--results", str(results)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in results.read_text().splitlines() if line.startswith("| firing")]
    [firing] = rows
    fires_per_s, split = (c.strip() for c in firing.strip("| ").split(" | ")[1:3])
    assert float(fires_per_s) > 0 and split.count("%") == 2, firing  # both replicas counted
