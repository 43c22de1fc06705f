"""The reference pages cannot fall behind the code (#41): the commands' and the settings'
tables are generated from the click group and from the settings' declarations
(tests/tools/reference_pages.py), and this fails when a page differs from what the code
says now, or when slotd reads a SLOTD_* variable that nothing declares."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from slotd.config import Settings
from slotd.environment import BY_NAME, INTERNAL, VARIABLES
from tests.tools import reference_pages

ROOT = Path(__file__).resolve().parent.parent
# The dashboard's own settings, read in slotd/web/ (its owner's), are kept by hand in the
# settings page's last table; this only checks that each is there.
HAND_KEPT = ("slotd/web/", "slotd/commands/dashboard.py")


def variables_read() -> dict[str, set[str]]:
    """Every string constant of slotd's code that is a whole SLOTD_* name, by file."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "slotd").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"SLOTD_[A-Z0-9_]+", node.value)
            ):
                found.setdefault(node.value, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_reference_pages_are_what_the_code_says() -> None:
    stale = reference_pages.out_of_date()
    assert stale == [], f"{stale}: run {reference_pages.COMMAND} and commit the pages"


def test_every_variable_slotd_reads_is_declared_and_every_declared_one_is_read() -> None:
    read = variables_read()
    page = (ROOT / "docs/reference/settings.md").read_text()
    for name, files in sorted(read.items()):
        if all(f.startswith(HAND_KEPT) for f in files):
            assert f"`{name}`" in page, f"{name} (read in {files}) is not on the settings page"
        else:
            assert name in BY_NAME or name in INTERNAL, (
                f"{name} is read in {sorted(files)} but not declared in slotd/environment.py"
            )
    unread = [v.name for v in VARIABLES if not read.get(v.name, set()) - {"slotd/environment.py"}]
    assert unread == [], f"declared but read nowhere: {unread}"


def test_the_declared_defaults_are_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings() (what a producer or a test builds) and Settings.from_env() on an empty
    # environment (what `slotd run` reads through the declarations) must agree.
    for name in list(os.environ):
        if name.startswith("SLOTD_") or name.startswith("DATABASE_URL"):
            monkeypatch.delenv(name)
    assert Settings.from_env() == Settings()


def test_a_change_to_a_command_or_a_setting_makes_the_page_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The check itself could be blind: an edited declaration must show.
    from dataclasses import replace

    changed = tuple(replace(v, default="9") if v.name == "SLOTD_SLOTS" else v for v in VARIABLES)
    monkeypatch.setattr(reference_pages, "VARIABLES", changed)
    assert reference_pages.out_of_date() == ["docs/reference/settings.md"]
    tables = reference_pages.settings_tables()
    assert "| `SLOTD_SLOTS` (`--slots`) | `9` |" in tables
    assert "[`slotd dead retry`](#slotd-dead-retry)" in reference_pages.cli_reference()


def test_every_metric_a_replica_exports_is_on_the_metrics_page() -> None:
    # The metrics page is prose, kept by hand; this keeps it complete: every family a
    # replica's registry collects (its fleet gauges and rate gauges from a stand-in source)
    # and every schedule gauge is named on it.
    from types import SimpleNamespace

    from slotd.ops.metrics import RATE_GAUGES, Metrics
    from slotd.supervisor.scheduler import ScheduleCollector

    window = {field: 1.0 for _, _, field in RATE_GAUGES}
    metrics = Metrics(
        slots=1, task_types=["t"], gauge_source=lambda: {"pending": {}, "rates": {"t": window}}
    )
    names = {family.name for family in metrics.registry.collect()}
    names |= {family.name for family in ScheduleCollector(SimpleNamespace()).describe()}
    assert len(names) >= 25, names
    page = (ROOT / "docs/reference/metrics.md").read_text()
    missing = sorted(n for n in names if not re.search(rf"`{n}(_total)?[{{`]", page))
    assert missing == [], f"not on docs/reference/metrics.md: {missing}"
