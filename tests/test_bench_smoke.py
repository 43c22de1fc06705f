"""The benchmark must not rot: run its slotd part at toy size and check that it produced
figures. Speed is never asserted here; the numbers at this size mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_runs_and_writes_figures(tmp_path: Path) -> None:
    results, raw = tmp_path / "RESULTS.md", tmp_path / "raw.json"
    results.write_text("## an earlier run\n")
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "run.py"), "--profile", "smoke",
           "--only", "slotd", "--results", str(results), "--json", str(raw)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
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
