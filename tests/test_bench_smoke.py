"""The benchmark must not rot: run its slotd part at toy size and check that it produced
figures. Speed is never asserted here; the numbers at this size mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# A loaded machine takes minutes over the smoke profile (220 s seen at load 36); the bound
# only has to catch a hang.
@pytest.mark.timeout(900)
def test_bench_runs_and_writes_figures(tmp_path: Path) -> None:
    results, raw = tmp_path / "RESULTS.md", tmp_path / "raw.json"
    results.write_text("## an earlier run\n")
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "run.py"), "--profile", "smoke",
           "--only", "slotd", "--results", str(results), "--json", str(raw)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    figures = json.loads(raw.read_text())["results"]
    for section in ("drain", "latency", "idle", "claim_latency", "enqueue", "memory",
                    "watchdog", "write_variants"):  # fmt: skip
        assert figures.get(section), section
    assert all(run["tasks_per_s"] > 0 for runs in figures["drain"].values() for run in runs)
    assert all(lat["n"] > 0 for lat in figures["latency"].values())
    text = results.read_text()
    assert "### 1. Drain" in text and "### 7. Watchdog" in text

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
