"""The layout shows the process model (issue 36): few modules directly under slotd/, the rest
in packages named for where they run, and no import cycles (tests/tools/import_cycles.py)."""

from __future__ import annotations

from pathlib import Path

from tests.tools import import_cycles

ROOT = Path(__file__).resolve().parent.parent

# Cycles still to break, each with the branch that breaks it. The test fails when one of them
# is gone too, so this list can only shrink. (Empty since #42 layered slotd.contrib.django.)
PENDING: list[list[str]] = []


def test_at_most_fifteen_modules_directly_under_slotd() -> None:
    _, known = import_cycles.graph(ROOT / "slotd")
    top = import_cycles.top_level(known)
    assert len(top) <= 15, top


def test_no_import_cycles_but_the_pending_ones() -> None:
    edges, known = import_cycles.graph(ROOT / "slotd")
    found = import_cycles.cycles(edges, sorted(known))
    assert [c for c in found if c not in PENDING] == [], "new import cycle"
    assert [c for c in PENDING if c not in found] == [], "a pending cycle is gone: remove it"


def test_the_counter_sees_a_function_level_cycle(tmp_path: Path) -> None:
    # The counter itself could be blind: two modules importing each other only inside a
    # function (and under TYPE_CHECKING) must still count as a cycle.
    pkg = tmp_path / "slotd"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from slotd import a\n")
    (pkg / "a.py").write_text("def f():\n    from slotd.inner import b\n")
    (pkg / "inner" / "__init__.py").write_text("")
    (pkg / "inner" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from slotd import a\n"
    )
    edges, known = import_cycles.graph(pkg)
    assert import_cycles.cycles(edges, sorted(known)) == [["slotd.a", "slotd.inner.b"]]
