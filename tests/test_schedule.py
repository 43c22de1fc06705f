"""Fire times and catch-up, pure: a fixed clock, no database (slotd.schedule)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import slotd
from slotd.schedule import CATCH_UP_MAX, LATE_GRACE, Schedule, lag_seconds, plan


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def registry() -> slotd.Registry:
    reg = slotd.Registry()
    reg.register("audit", lambda task, ctx: None, ceiling=timedelta(minutes=1))
    return reg


def cron(expr: str, zone: str = "UTC", catch_up: str = "latest") -> Schedule:
    return registry().schedule("s", task_type="audit", cron=expr, timezone=zone, catch_up=catch_up)


def every(period: timedelta, catch_up: str = "latest") -> Schedule:
    return registry().schedule("s", task_type="audit", every=period, catch_up=catch_up)


def fires(schedule: Schedule, after: datetime, until: datetime) -> list[str]:
    return [t.isoformat() for t in schedule.fire_times(after, until, 100)]


# declaration


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task_type": "nope", "every": timedelta(minutes=1)}, "has no handler"),
        ({"task_type": "audit"}, "exactly one of cron= or every="),
        ({"task_type": "audit", "cron": "* * * * *", "every": timedelta(1)}, "exactly one"),
        ({"task_type": "audit", "cron": "61 * * * *"}, "invalid cron expression"),
        ({"task_type": "audit", "cron": "0 3 * *"}, "5-field"),
        ({"task_type": "audit", "cron": "*/5 * * * * *"}, "5-field"),
        ({"task_type": "audit", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "time zone"),
        ({"task_type": "audit", "every": timedelta(milliseconds=10)}, "at least 1s"),
        ({"task_type": "audit", "every": 60}, "timedelta"),
        ({"task_type": "audit", "every": timedelta(1), "catch_up": "most"}, "catch_up"),
        ({"task_type": "audit", "every": timedelta(1), "overlap": "pile"}, "overlap"),
        ({"task_type": "audit", "every": timedelta(1), "payload": [1]}, "JSON object"),
        ({"task_type": "audit", "every": timedelta(1), "payload": {"x": object()}}, "JSON"),
    ],
)
def test_bad_declarations_raise_value_error_at_declaration(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        registry().schedule("nightly", **kwargs)  # type: ignore[arg-type]


def test_schedule_names_follow_the_task_type_rule_and_are_unique() -> None:
    reg = registry()
    with pytest.raises(ValueError, match="invalid schedule name"):
        reg.schedule("Nightly Audit", task_type="audit", every=timedelta(hours=1))
    reg.schedule("nightly", task_type="audit", every=timedelta(hours=1))
    with pytest.raises(ValueError, match="already declared"):
        reg.schedule("nightly", task_type="audit", cron="0 3 * * *")
    assert [s.name for s in reg.schedules] == ["nightly"]


# fire times


def test_every_fires_on_whole_multiples_of_the_period_since_the_epoch() -> None:
    s = every(timedelta(minutes=5))
    assert s.next_after(utc(2026, 12, 1, 10, 2, 13)) == utc(2026, 12, 1, 10, 5)
    assert s.next_after(utc(2026, 12, 1, 10, 5)) == utc(2026, 12, 1, 10, 10)  # strictly after
    assert s.last_at_or_before(utc(2026, 12, 1, 10, 5)) == utc(2026, 12, 1, 10, 5)
    assert fires(s, utc(2026, 12, 1, 10, 0), utc(2026, 12, 1, 10, 12)) == [
        "2026-12-01T10:05:00+00:00",
        "2026-12-01T10:10:00+00:00",
    ]


def test_berlin_spring_forward_a_missing_local_time_fires_once_at_the_next_valid_instant() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that night.
    s = cron("30 2 * * *", "Europe/Berlin")
    got = fires(s, utc(2026, 3, 27, 12), utc(2026, 3, 30, 12))
    assert got == [
        "2026-03-28T01:30:00+00:00",  # 02:30 CET
        "2026-03-29T01:00:00+00:00",  # 03:00 CEST, the first valid instant after the gap
        "2026-03-30T00:30:00+00:00",  # 02:30 CEST
    ]


def test_berlin_fall_back_a_repeated_local_time_fires_once() -> None:
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice that night.
    s = cron("30 2 * * *", "Europe/Berlin")
    got = fires(s, utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert got == ["2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"]
    # Stepping expressions keep real time through the repeated hour: both 02:00s fire.
    half = cron("*/30 * * * *", "Europe/Berlin")
    night = fires(half, utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2, 15))
    assert night == [
        "2026-10-25T00:00:00+00:00",  # 02:00 CEST
        "2026-10-25T00:30:00+00:00",  # 02:30 CEST
        "2026-10-25T01:00:00+00:00",  # 02:00 CET
        "2026-10-25T01:30:00+00:00",  # 02:30 CET
        "2026-10-25T02:00:00+00:00",  # 03:00 CET
    ]


def test_new_york_spring_forward_and_fall_back() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
    s = cron("30 2 * * *", "America/New_York")
    assert fires(s, utc(2026, 3, 7, 12), utc(2026, 3, 9, 12)) == [
        "2026-03-08T07:00:00+00:00",  # 03:00 EDT
        "2026-03-09T06:30:00+00:00",  # 02:30 EDT
    ]
    s = cron("30 1 * * *", "America/New_York")
    assert fires(s, utc(2026, 10, 31, 12), utc(2026, 11, 2, 12)) == [
        "2026-11-01T05:30:00+00:00",  # 01:30 EDT, once; not again at 01:30 EST
        "2026-11-02T06:30:00+00:00",
    ]


def test_a_cron_runs_in_its_zone_not_in_utc() -> None:
    s = cron("0 3 * * *", "Europe/Berlin")
    assert s.next_after(utc(2026, 12, 1, 0)) == utc(2026, 12, 1, 2)  # 03:00 CET
    assert s.next_after(utc(2026, 7, 1, 0)) == utc(2026, 7, 1, 1)  # 03:00 CEST
    assert s.period_after(utc(2026, 12, 1, 0)) == timedelta(days=1)


# plans


def test_a_new_schedule_fires_first_at_the_first_fire_time_after_its_row_was_created() -> None:
    s = every(timedelta(minutes=1))
    anchor = utc(2026, 12, 1, 10, 0, 30)
    assert not plan(s, None, anchor, utc(2026, 12, 1, 10, 0, 59)).due
    due = plan(s, None, anchor, utc(2026, 12, 1, 10, 1, 0, 5000))
    assert due.fires == [utc(2026, 12, 1, 10, 1)] and due.new_last == utc(2026, 12, 1, 10, 1)
    assert due.next_fire == utc(2026, 12, 1, 10, 2)


def test_late_fire_times_are_always_enqueued_whatever_the_policy() -> None:
    # Three seconds late on an every=1s schedule: late, not missed.
    last, now = utc(2026, 12, 1, 10, 0, 0), utc(2026, 12, 1, 10, 0, 3, 500)
    for policy in ("skip", "latest", "all"):
        due = plan(every(timedelta(seconds=1), policy), last, last, now)
        assert due.fires == [utc(2026, 12, 1, 10, 0, n) for n in (1, 2, 3)], policy


def test_catch_up_after_a_stopped_fleet_follows_each_policy() -> None:
    # Hourly; the fleet was down from 10:00 to 14:20.
    last, now = utc(2026, 12, 1, 10), utc(2026, 12, 1, 14, 20)
    hourly = {p: cron("0 * * * *", catch_up=p) for p in ("skip", "latest", "all")}
    skip = plan(hourly["skip"], last, last, now)
    assert skip.fires == [] and skip.new_last == utc(2026, 12, 1, 14)
    assert skip.next_fire == utc(2026, 12, 1, 15)
    assert plan(hourly["latest"], last, last, now).fires == [utc(2026, 12, 1, 14)]
    assert plan(hourly["all"], last, last, now).fires == [
        utc(2026, 12, 1, h) for h in (11, 12, 13, 14)
    ]
    for due in (plan(s, last, last, now) for s in hourly.values()):
        assert due.new_last == utc(2026, 12, 1, 14)


def test_catch_up_all_is_bounded_to_a_day_and_to_the_most_recent_fire_times() -> None:
    last, now = utc(2026, 11, 1), utc(2026, 12, 1, 0, 0, 30)
    six_hourly = plan(cron("0 */6 * * *", catch_up="all"), last, last, now)
    # A day back, not a month.
    assert six_hourly.fires == [utc(2026, 11, 30, h) for h in (6, 12, 18)] + [utc(2026, 12, 1)]
    secondly = plan(every(timedelta(seconds=1), "all"), last, last, now)
    assert len(secondly.fires) == CATCH_UP_MAX
    assert secondly.fires[-1] == utc(2026, 12, 1, 0, 0, 30)
    assert secondly.fires == sorted(secondly.fires)


def test_latest_keeps_the_most_recent_missed_one_and_every_late_one() -> None:
    s = every(timedelta(seconds=1), "latest")
    last, now = utc(2026, 12, 1, 10), utc(2026, 12, 1, 11)
    due = plan(s, last, last, now)
    grace = int(LATE_GRACE.total_seconds())
    expected = [now - timedelta(seconds=grace)] + [
        now - timedelta(seconds=n) for n in range(grace - 1, -1, -1)
    ]
    assert due.fires == expected


def test_lag_is_the_age_of_the_oldest_fire_time_not_yet_fired() -> None:
    s = every(timedelta(minutes=1))
    last = utc(2026, 12, 1, 10)
    assert lag_seconds(s, last, last, utc(2026, 12, 1, 10, 0, 59)) == 0.0
    assert lag_seconds(s, last, last, utc(2026, 12, 1, 10, 3, 30)) == 150.0
