"""The shipped alert rules, evaluated by promtool on series that must page and series that must not.

Each case is a promtool unit-test group written into a temporary directory. The rules under test
are the shipped file with only `description` and `runbook` dropped (promtool compares annotations
exactly, and pinning paragraphs of prose in tests would only make them noisy); expressions,
`for`, labels and the `summary` line are the shipped ones, and a separate test renders every
annotation of the untouched file.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "slotd" / "alerts" / "rules.yaml"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install --no-install-recommends prometheus)",
)

Case = dict[str, Any]


def fleet(metric: str, values: str, replicas: int = 3, **labels: str) -> list[dict[str, str]]:
    """The same fleet-wide gauge as every replica exports it (they all read the same table)."""
    out = []
    for n in range(1, replicas + 1):
        label_text = ",".join(f'{k}="{v}"' for k, v in {**labels, "instance": f"r{n}"}.items())
        out.append({"series": f"{metric}{{{label_text}}}", "values": values})
    return out


def slots(per_replica: int = 4, replicas: int = 3, minutes: int = 60) -> list[dict[str, str]]:
    return fleet("slotd_task_slots", f"{per_replica}x{minutes}", replicas)


def case(series: list[dict[str, str]], *checks: dict[str, Any]) -> Case:
    return {"interval": "1m", "input_series": series, "alert_rule_test": list(checks)}


def expect(alert: str, at: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": list(alerts)}


def fired(summary: str, **labels: str) -> dict[str, Any]:
    return {"exp_labels": labels, "exp_annotations": {"summary": summary}}


def write_rules_without_prose(into: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            for key in ("description", "runbook"):
                rule.get("annotations", {}).pop(key, None)
    path = into / "rules.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def promtool_test(tmp_path: Path, rules: Path, *cases: Case) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    test_file = tmp_path / "test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": list(cases)},
            sort_keys=False,
        )
    )
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )


def assert_promtool_passes(tmp_path: Path, *cases: Case) -> None:
    proc = promtool_test(tmp_path, write_rules_without_prose(tmp_path), *cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the rules file itself ------------------------------------------------------------------


def test_promtool_check_rules_accepts_the_shipped_file() -> None:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 8 rules found" in proc.stdout


def test_every_rule_has_severity_and_operator_annotations() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == {
        "SlotdTaskStarvation",
        "SlotdTaskFailureRate",
        "SlotdDeadLettersGrowing",
        "SlotdTaskTypeUnhandled",
        "SlotdSlotRestartLoop",
        "SlotdNoReplicas",
        "SlotdScheduleLate",
        "SlotdVacuumHorizonHeld",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]


def test_starvation_expression_is_the_one_the_design_reasons_about() -> None:
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    expr = " ".join(rules["SlotdTaskStarvation"]["expr"].split())
    assert expr == (
        "max(slotd_task_oldest_due_seconds) > 300 and "
        "(sum(max by (task_type) (slotd_tasks_running)) or vector(0)) < sum(slotd_task_slots)"
    )


def test_every_annotation_of_the_shipped_file_renders(tmp_path: Path) -> None:
    # promtool prints the alerts it got when they differ from the expectation; asking for none
    # makes it print every rendered annotation, which must hold no template error or leftover.
    firing = [
        case(
            [*fleet("slotd_task_oldest_due_seconds", "0+60x40"), *slots()],
            expect("SlotdTaskStarvation", "20m"),
        ),
        case(
            fleet("slotd_task_outcomes_total", "0+3x40", 1, task_type="report", outcome="failure"),
            expect("SlotdTaskFailureRate", "30m"),
        ),
        case(
            [*fleet("slotd_tasks_dead", "0x35 4x10", task_type="report"), *slots()],
            expect("SlotdDeadLettersGrowing", "40m"),
        ),
        case(
            fleet("slotd_tasks_pending", "2x30", task_type="legacy"),
            expect("SlotdTaskTypeUnhandled", "20m"),
        ),
        case(
            fleet("slotd_slot_restarts_total", "0+1x30", 1, reason="runner_killed"),
            expect("SlotdSlotRestartLoop", "25m"),
        ),
        case(
            [
                *fleet("slotd_schedule_lag_seconds", "0+60x30", schedule="sweep"),
                *fleet("slotd_schedule_period_seconds", "300x30", schedule="sweep"),
            ],
            expect("SlotdScheduleLate", "25m"),
        ),
        case(
            fleet("slotd_vacuum_horizon_age_seconds", "0+60x40"),
            expect("SlotdVacuumHorizonHeld", "30m"),
        ),
    ]
    proc = promtool_test(tmp_path, RULES, *firing)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    for alert in (
        "SlotdTaskStarvation",
        "SlotdTaskFailureRate",
        "SlotdDeadLettersGrowing",
        "SlotdTaskTypeUnhandled",
        "SlotdSlotRestartLoop",
        "SlotdScheduleLate",
        "SlotdVacuumHorizonHeld",
    ):
        assert f'Labels:{{alertname="{alert}"' in output, output
    assert output.count("runbook=") == 7, output
    assert "error expanding template" not in output, output
    assert "{{" not in output and "<no value>" not in output, output


def test_a_wrong_expectation_fails_so_the_cases_below_can_fail(tmp_path: Path) -> None:
    never_due = case(
        [*fleet("slotd_task_oldest_due_seconds", "0x30"), *slots()],
        expect("SlotdTaskStarvation", "20m", fired("anything", severity="page")),
    )
    proc = promtool_test(tmp_path, write_rules_without_prose(tmp_path), never_due)
    assert proc.returncode == 1, proc.stdout


# --- starvation -------------------------------------------------------------------------------


def test_starvation_does_not_page_on_a_fleet_sweep_draining_with_every_slot_busy(
    tmp_path: Path,
) -> None:
    # Ten thousand orgs share one run_at: oldest-due climbs for many minutes while all 12 slots
    # (3 replicas x 4) run, split over two types.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_task_oldest_due_seconds", "0+60x60"),
                *fleet("slotd_tasks_running", "8x60", task_type="seat_cap_audit"),
                *fleet("slotd_tasks_running", "4x60", task_type="prefix_delete"),
                *slots(),
            ],
            expect("SlotdTaskStarvation", "15m"),
            expect("SlotdTaskStarvation", "45m"),
        ),
    )


def test_starvation_is_not_hidden_by_one_orphaned_lease(tmp_path: Path) -> None:
    # One crashed worker's lease counts as running until ceiling + margin; 1 of 12 slots busy
    # while work waits is the shape the alert exists for.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_task_oldest_due_seconds", "0+60x30"),
                *fleet("slotd_tasks_running", "1x30", task_type="prefix_delete"),
                *slots(),
            ],
            # due 300 s at 5m; > 300 from 6m; pending for 5m: silent at 10m, firing at 11m on.
            expect("SlotdTaskStarvation", "10m"),
            expect(
                "SlotdTaskStarvation",
                "12m",
                fired("slotd: tasks due for 12m 0s while slots sit idle", severity="page"),
            ),
        ),
    )


def test_starvation_stays_quiet_for_work_waiting_only_on_its_own_limit(tmp_path: Path) -> None:
    # 1,000 tasks of a max_running=1 type wait for an hour behind the one running; the
    # exporter leaves rows held back by their own limit out of oldest-due (pinned against a
    # real daemon in tests/test_priority_limits.py), so only the fresh other work shows.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_task_oldest_due_seconds", "2x60"),
                *fleet("slotd_tasks_pending", "1000x60", task_type="rebuild"),
                *fleet("slotd_tasks_running", "1x60", task_type="rebuild"),
                *fleet("slotd_task_type_limit", "1x60", task_type="rebuild"),
                *slots(),
            ],
            expect("SlotdTaskStarvation", "30m"),
            expect("SlotdTaskStarvation", "59m"),
        ),
    )


def test_starvation_still_fires_for_other_work_beside_a_type_at_its_limit(
    tmp_path: Path,
) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_task_oldest_due_seconds", "0+60x30"),
                *fleet("slotd_tasks_running", "1x30", task_type="rebuild"),
                *fleet("slotd_task_type_limit", "1x30", task_type="rebuild"),
                *slots(),
            ],
            expect(
                "SlotdTaskStarvation",
                "12m",
                fired("slotd: tasks due for 12m 0s while slots sit idle", severity="page"),
            ),
        ),
    )


def test_starvation_fires_when_nothing_runs_and_no_running_series_exists(tmp_path: Path) -> None:
    # slotd_tasks_running is a GROUP BY: with nothing running there is no series; `or vector(0)`
    # is what keeps the comparison alive.
    assert_promtool_passes(
        tmp_path,
        case(
            [*fleet("slotd_task_oldest_due_seconds", "0+60x30"), *slots()],
            expect(
                "SlotdTaskStarvation",
                "20m",
                fired("slotd: tasks due for 20m 0s while slots sit idle", severity="page"),
            ),
        ),
    )


def test_starvation_counts_fleet_running_once_not_once_per_replica(tmp_path: Path) -> None:
    # Each of the 3 replicas exports the fleet's 4 running tasks; summing them would read 12 of 12
    # slots busy and hide starvation.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_task_oldest_due_seconds", "0+60x30"),
                *fleet("slotd_tasks_running", "4x30", task_type="seat_cap_audit"),
                *slots(),
            ],
            expect(
                "SlotdTaskStarvation",
                "20m",
                fired("slotd: tasks due for 20m 0s while slots sit idle", severity="page"),
            ),
        ),
    )


def test_starvation_stays_quiet_while_work_is_fresh(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [*fleet("slotd_task_oldest_due_seconds", "240x60"), *slots()],
            expect("SlotdTaskStarvation", "50m"),
        ),
    )


# --- failure rate -----------------------------------------------------------------------------


def outcomes(task_type: str, **per_minute: int) -> list[dict[str, str]]:
    series: list[dict[str, str]] = []
    for outcome, rate in per_minute.items():
        series += fleet(
            "slotd_task_outcomes_total", f"0+{rate}x60", 1, task_type=task_type, outcome=outcome
        )
    return series


def test_failure_rate_fires_on_failures_and_timeouts_per_type(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *outcomes("report", success=2, failure=1, timeout=1),
                *outcomes("audit", success=50, failure=1),
            ],
            expect("SlotdTaskFailureRate", "9m"),
            expect(
                "SlotdTaskFailureRate",
                "30m",
                fired(
                    "slotd: report attempts failing or timing out (50%)",
                    severity="ticket",
                    task_type="report",
                ),
            ),
        ),
    )


def test_failure_rate_ignores_one_failure_of_a_rare_job(tmp_path: Path) -> None:
    # An hourly job that failed once is 100 % of its attempts, and retries with backoff.
    assert_promtool_passes(
        tmp_path,
        case(
            fleet(
                "slotd_task_outcomes_total", "0x20 1x40", 1, task_type="nightly", outcome="failure"
            ),
            expect("SlotdTaskFailureRate", "25m"),
            expect("SlotdTaskFailureRate", "35m"),
        ),
    )


# --- dead letters -----------------------------------------------------------------------------


def test_dead_letters_growing_fires_with_the_number_of_new_ones(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_tasks_dead", "2x40 5x30", task_type="report"),
                *fleet("slotd_tasks_dead", "7x70", task_type="audit"),
                *slots(minutes=70),
            ],
            expect("SlotdDeadLettersGrowing", "40m"),
            expect(
                "SlotdDeadLettersGrowing",
                "45m",
                fired(
                    "slotd: 3 new dead letter(s) for report in 30m",
                    severity="ticket",
                    task_type="report",
                ),
            ),
        ),
    )


def test_dead_letters_growing_sees_a_type_whose_first_dead_letter_appears(tmp_path: Path) -> None:
    # No dead letters means no series: the past falls back to 0 because slotd was scraped then.
    assert_promtool_passes(
        tmp_path,
        case(
            [*fleet("slotd_tasks_dead", "_x40 1x20", task_type="report"), *slots()],
            expect(
                "SlotdDeadLettersGrowing",
                "45m",
                fired(
                    "slotd: 1 new dead letter(s) for report in 30m",
                    severity="ticket",
                    task_type="report",
                ),
            ),
        ),
    )


def test_dead_letters_do_not_page_when_retention_prunes_them(tmp_path: Path) -> None:
    # The hourly cleanup drops the gauge; increase() would read that as a counter reset.
    assert_promtool_passes(
        tmp_path,
        case(
            [*fleet("slotd_tasks_dead", "10x30 2x30 4x30", task_type="report"), *slots(minutes=90)],
            expect("SlotdDeadLettersGrowing", "40m"),
            expect("SlotdDeadLettersGrowing", "58m"),
        ),
    )


def test_dead_letters_that_predate_prometheus_are_not_new(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [*fleet("slotd_tasks_dead", "5x30", task_type="report"), *slots(minutes=30)],
            expect("SlotdDeadLettersGrowing", "10m"),
        ),
    )


# --- type without a handler -------------------------------------------------------------------


def test_pending_type_with_no_handler_anywhere_fires(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_tasks_pending", "3x40", task_type="legacy_export"),
                *fleet("slotd_tasks_pending", "9x40", task_type="report"),
                *fleet("slotd_replica_handlers", "1x40", 2, task_type="report"),
            ],
            expect("SlotdTaskTypeUnhandled", "10m"),
            expect(
                "SlotdTaskTypeUnhandled",
                "20m",
                fired(
                    "slotd: 3 legacy_export task(s) pending with no handler anywhere",
                    severity="ticket",
                    task_type="legacy_export",
                ),
            ),
        ),
    )


def test_pending_type_handled_by_one_replica_only_is_fine(tmp_path: Path) -> None:
    # Also: a handler that is briefly nowhere during a rolling update does not page.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_tasks_pending", "3x40", task_type="report"),
                *fleet("slotd_tasks_pending", "0x40", task_type="idle"),
                *fleet("slotd_replica_handlers", "_x5 1x35", 1, task_type="report"),
            ],
            expect("SlotdTaskTypeUnhandled", "4m"),
            expect("SlotdTaskTypeUnhandled", "30m"),
        ),
    )


def test_pending_type_with_no_handler_is_quiet_while_paused(tmp_path: Path) -> None:
    # An operator paused the type (its handler was retired): no ticket until it is resumed.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_tasks_pending", "3x60", task_type="legacy_export"),
                *fleet("slotd_task_type_paused", "1x30 0x30", task_type="legacy_export"),
                *fleet("slotd_replica_handlers", "1x60", 2, task_type="report"),
            ],
            expect("SlotdTaskTypeUnhandled", "25m"),
            expect("SlotdTaskTypeUnhandled", "40m"),
            expect(
                "SlotdTaskTypeUnhandled",
                "50m",
                fired(
                    "slotd: 3 legacy_export task(s) pending with no handler anywhere",
                    severity="ticket",
                    task_type="legacy_export",
                ),
            ),
        ),
    )


# --- slot restart loop ------------------------------------------------------------------------


def test_slot_restart_loop_fires_per_replica_across_reasons(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [
                {
                    "series": 'slotd_slot_restarts_total{instance="r1",reason="runner_crashed"}',
                    "values": "0+1x40",
                },
                {
                    "series": 'slotd_slot_restarts_total{instance="r1",reason="slot_died"}',
                    "values": "0+1x40",
                },
                # r2 lost two slots in 15 minutes: noise, not a loop.
                {
                    "series": 'slotd_slot_restarts_total{instance="r2",reason="runner_crashed"}',
                    "values": "0x10 1x10 2x20",
                },
            ],
            expect(
                "SlotdSlotRestartLoop",
                "25m",
                fired("slotd: slots restarting in a loop on r1", severity="ticket", instance="r1"),
            ),
        ),
    )


def test_slot_restart_loop_stays_quiet_for_occasional_restarts(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_slot_restarts_total", "0+1x5 5x55", 1, reason="runner_crashed"),
                # Recycling runners after runner_max_tasks is planned, however often it happens.
                *fleet("slotd_slot_restarts_total", "0+2x60", 1, reason="runner_recycled"),
            ],
            expect("SlotdSlotRestartLoop", "30m"),
        ),
    )


# --- no replica at all --------------------------------------------------------------------------


def test_no_replicas_fires_when_the_whole_fleet_is_gone(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case(
            [*fleet("slotd_task_slots", "4x5", 2)],  # two replicas, gone after five minutes
            expect("SlotdNoReplicas", "10m"),
            expect(
                "SlotdNoReplicas",
                "25m",
                fired("slotd: no replica has reported for 10 minutes", severity="page"),
            ),
        ),
    )


def test_no_replicas_stays_quiet_while_one_replica_reports(tmp_path: Path) -> None:
    assert_promtool_passes(
        tmp_path,
        case([*fleet("slotd_task_slots", "4x60", 1)], expect("SlotdNoReplicas", "50m")),
    )


# --- schedules --------------------------------------------------------------------------------


def test_schedule_late_fires_past_two_periods_when_no_replica_fires_it(tmp_path: Path) -> None:
    # A 5-minute schedule whose lag grows a minute per minute on every replica: more than two
    # periods (600 s) from 11m, pending for 5m, firing from 16m.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_schedule_lag_seconds", "0+60x30", schedule="sweep"),
                *fleet("slotd_schedule_period_seconds", "300x30", schedule="sweep"),
            ],
            expect("SlotdScheduleLate", "15m"),
            expect(
                "SlotdScheduleLate",
                "17m",
                fired("slotd: schedule sweep is 17m 0s late", severity="ticket", schedule="sweep"),
            ),
        ),
    )


def test_schedule_late_stays_quiet_while_one_replica_still_fires_it(tmp_path: Path) -> None:
    # One replica's schedule thread is stuck (its lag grows) but another fires on time.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                {"series": 'slotd_schedule_lag_seconds{schedule="sweep",instance="r1"}',
                 "values": "0+60x40"},
                {"series": 'slotd_schedule_lag_seconds{schedule="sweep",instance="r2"}',
                 "values": "0x40"},
                *fleet("slotd_schedule_period_seconds", "300x40", 2, schedule="sweep"),
            ],
            expect("SlotdScheduleLate", "30m"),
        ),
    )  # fmt: skip


def test_schedule_late_ignores_a_short_period_schedule_a_few_seconds_behind(
    tmp_path: Path,
) -> None:
    # every=1s, 30 s behind for half an hour: thirty periods, but under a minute.
    assert_promtool_passes(
        tmp_path,
        case(
            [
                *fleet("slotd_schedule_lag_seconds", "30x40", schedule="tick"),
                *fleet("slotd_schedule_period_seconds", "1x40", schedule="tick"),
            ],
            expect("SlotdScheduleLate", "30m"),
        ),
    )


def test_vacuum_horizon_held_pages_after_twenty_minutes_not_for_a_short_report(
    tmp_path: Path,
) -> None:
    # Held from minute 0 and growing by 60 s a minute: past 900 s at minute 16, for 5m -> 21m.
    # A 10-minute report (the age back to 0 after it) never fires.
    assert_promtool_passes(
        tmp_path,
        case(
            fleet("slotd_vacuum_horizon_age_seconds", "0+60x40"),
            expect("SlotdVacuumHorizonHeld", "20m"),
            expect(
                "SlotdVacuumHorizonHeld",
                "22m",
                fired("slotd: vacuum has been held back for 22m 0s", severity="ticket"),
            ),
        ),
        case(
            fleet("slotd_vacuum_horizon_age_seconds", "0+60x10 0x30"),
            expect("SlotdVacuumHorizonHeld", "15m"),
            expect("SlotdVacuumHorizonHeld", "30m"),
        ),
    )
