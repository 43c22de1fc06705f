"""The RESULTS.md tables from run.sh's output directory: per scenario, system and phase.

    python summarize.py RUNS_DIR [--plots DOCS_DIR]

Reads each scenario's harness run directory (run_dir.txt -> summary.json, raw.csv), its
audit JSON, releases-slotd.json (releases.py) and command.txt. Prints markdown. With
--plots, copies the harness's claim_p99 / throughput / dead_tuples plots for each scenario
into DOCS_DIR, downscaled to 1000 px and 64 colours (Pillow, which the harness's
matplotlib brings)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

PLOTS = ("claim_p99", "throughput", "dead_tuples")


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def p99_series(raw_csv: Path) -> dict[str, list[tuple[float, str, float]]]:
    """(elapsed_s, phase, worst replica's claim_p99_ms) per system and sample time."""
    worst: dict[tuple[str, str], tuple[float, str, float]] = {}
    with raw_csv.open() as fh:
        for row in csv.DictReader(fh):
            if row["metric"] != "claim_p99_ms" or row["subject_kind"] != "adapter":
                continue
            key = (row["system"], row["sampled_at"])
            value = float(row["value"])
            t = float(row["elapsed_s"])
            if key not in worst or value > worst[key][2]:
                worst[key] = (t, row["phase_label"], value)
    out: dict[str, list[tuple[float, str, float]]] = defaultdict(list)
    for (system, _), sample in worst.items():
        out[system].append(sample)
    for samples in out.values():
        samples.sort()
    return out


def p99_recovered_after(
    samples: list[tuple[float, str, float]], stress: set[str], recovery: str, baseline: float
) -> float | None:
    """Seconds from the last stress sample to the first recovery sample whose p99 is back
    under twice the baseline median (or baseline + 20 ms, whichever is larger)."""
    stress_end = max((t for t, phase, _ in samples if phase in stress), default=None)
    if stress_end is None:
        return None
    limit = max(2 * baseline, baseline + 20.0)
    for t, phase, value in samples:
        # An empty window reports 0: no completions is not a recovered latency.
        if phase == recovery and t > stress_end and 0 < value <= limit:
            return round(t - stress_end, 1)
    return None


def scenario_tables(scenario_dir: Path) -> str:
    run_dir = Path((scenario_dir / "run_dir.txt").read_text().strip())
    summary = json.loads((run_dir / "summary.json").read_text())
    series = p99_series(run_dir / "raw.csv")
    phases = [p for p in summary["phases"] if p["type"] != "warmup"]
    stress_types = {
        "idle-in-tx",
        "high-load",
        "kill-worker",
        "start-worker",
        "postgres-restart",
        "pg-backend-kill",
        "pool-exhaustion",
        "repeated-kill",
    }
    lines = [
        f"Harness run `{run_dir.name}`. Phases: "
        + ", ".join(f"{p['label']} ({p['type']}, {p['duration_s']} s)" for p in summary["phases"]),
        "",
        "| system | phase | completed/s (median) | pickup p99 ms (median / worst) "
        "| peak dead tuples | jobs_lost (harness) | recovery s (harness) | p99 back s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, block in summary["systems"].items():
        baseline_p99 = None
        for p in phases:
            if p["type"] == "clean":
                baseline_p99 = block["phases"].get(p["label"], {}).get("median_claim_p99_ms")
                break
        stress_seen: set[str] = set()
        for p in phases:
            ph = block["phases"].get(p["label"])
            if ph is None:
                continue
            worst = max(
                (v for _, phase, v in series.get(system, []) if phase == p["label"]), default=None
            )
            back = None
            if p["type"] in stress_types:
                stress_seen.add(p["label"])
            elif stress_seen and baseline_p99:
                back = p99_recovered_after(
                    series.get(system, []), stress_seen, p["label"], baseline_p99
                )
                stress_seen = set()
            lines.append(
                f"| {system} | {p['label']} ({p['type']}) "
                f"| {fmt(ph.get('median_throughput_per_s'))} "
                f"| {fmt(ph.get('median_claim_p99_ms'))} / {fmt(worst)} "
                f"| {fmt(ph.get('peak_dead_tup'), 0)} | {fmt(ph.get('jobs_lost'))} "
                f"| {fmt(ph.get('chaos_recovery_time_s'))} | {fmt(back)} |"
            )
    for name in ("audit-slotd.json", "audit-procrastinate.json"):
        path = scenario_dir / name
        if not path.exists():
            continue
        audit = json.loads(path.read_text() or "{}")
        if audit.get("system") == "slotd":
            drain = audit.get("drain", {})
            lines += [
                "",
                f"Audit, slotd: {audit['enqueued']} enqueued (committed), {audit['finished']} "
                f"finished, {audit['lost']} lost, {audit['ran_twice']} ran twice "
                f"({audit['ran_twice_same_attempt']} under one attempt number), "
                f"{len(audit['dead_letters'])} dead letters, "
                f"{drain.get('left_at_stop', 0)} still queued when the harness stopped, of "
                f"which one replica then ran "
                f"{drain.get('left_at_stop', 0) - drain.get('left_after_drain', 0)} in "
                f"{drain.get('drain_s', 0)} s ({audit['still_queued']} still queued at the "
                "audit's timeout: in the table, not lost).",
            ]
            if audit["ran_twice"]:
                lines.append(f"Ran twice (id: attempts): {audit['ran_twice_ids']}")
            releases_path = scenario_dir / "releases-slotd.json"
            if releases_path.exists():
                releases = json.loads(releases_path.read_text())
                rising = releases["unstarted_then_higher_attempt"]
                lines += [
                    "",
                    f"Shutdown releases, slotd (releases.py over its log): "
                    f"{releases['unstarted_releases']} claims released before their handler "
                    f"started, {len(releases['released_unstarted_more_than_once'])} tasks "
                    f"released so more than once, {len(rising)} whose next attempt number "
                    "rose after such a release" + (f": {sorted(rising)}" if rising else "") + ".",
                ]
        elif audit.get("system") == "procrastinate":
            lines += [
                "",
                f"Audit, procrastinate (its own tables): {audit['jobs']} jobs, by status "
                f"{audit['by_status']}, {audit['started_twice']} started twice, "
                f"{audit['stuck_doing']} left `doing` by a killed worker.",
            ]
    command = (scenario_dir / "command.txt").read_text().strip().splitlines()
    lines += ["", "```", *command, "```"]
    return "\n".join(lines)


def copy_plots(scenario: str, scenario_dir: Path, docs: Path) -> None:
    from PIL import Image

    run_dir = Path((scenario_dir / "run_dir.txt").read_text().strip())
    docs.mkdir(parents=True, exist_ok=True)
    for plot in PLOTS:
        src = run_dir / "plots" / f"{plot}.png"
        if not src.exists():
            continue
        image = Image.open(src).convert("RGB")
        image.thumbnail((1000, 1000))
        image.quantize(colors=64).save(docs / f"{scenario}-{plot}.png", optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", type=Path)
    parser.add_argument("--plots", type=Path)
    args = parser.parse_args()
    for scenario_dir in sorted(p for p in args.runs.iterdir() if (p / "run_dir.txt").exists()):
        print(f"### {scenario_dir.name}\n")
        try:
            print(scenario_tables(scenario_dir))
        except (OSError, KeyError, ValueError) as exc:
            print(f"(incomplete: {exc})")
        print()
        if args.plots:
            copy_plots(scenario_dir.name, scenario_dir, args.plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
