"""The state machine page (docs/explanation/state-machine.md) cannot drift from the code: its
states are slotd's states, every statement it names is a statement of sql/, and its
diagram draws exactly the arrows its table lists. (Its example runs in
tests/test_docs_examples.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from slotd.repository.states import STATES, TERMINAL

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "explanation" / "state-machine.md"
NEW = "(new)"  # a table's "from" for an enqueue; the diagram's [*]


def _section(title: str) -> str:
    return PAGE.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _rows(section: str) -> list[list[str]]:
    rows = [ln for ln in section.splitlines() if ln.startswith("| ")]
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]
    return [r for r in cells[1:] if not set(r[0]) <= {"-", " "}]  # past the header


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def sql_names() -> set[str]:
    text = "\n".join(p.read_text() for p in sorted((ROOT / "sql").glob("queries*.sql")))
    return set(re.findall(r"^-- (?:name|fragment): (\S+)\s*$", text, re.M))


def transitions() -> list[tuple[str, str, str]]:
    """(from, to, statement cell) per arrow of the transitions table."""
    out = []
    for row in _rows(_section("The transitions")):
        sources, target, _when, statement = row
        for source in [NEW] if sources == NEW else _names(sources):
            (to,) = _names(target)
            out.append((source, to, statement))
    return out


def diagram_arrows() -> set[tuple[str, str]]:
    block = _section("The transitions").split("```mermaid\n", 1)[1].split("```", 1)[0]
    arrows = re.findall(r"^\s*(\[\*\]|\w+) --> (\w+)", block, re.M)
    return {(NEW if a == "[*]" else a, b) for a, b in arrows}


def test_the_states_table_is_slotds_states_in_order() -> None:
    listed = [_names(row[0])[0] for row in _rows(_section("The states"))]
    assert listed == list(STATES)
    left_by = {_names(row[0])[0]: row[2] for row in _rows(_section("The states"))}
    assert left_by["succeeded"] == "nothing: terminal"
    assert all("dead retry" in left_by[s] for s in TERMINAL - {"succeeded"})


def test_every_state_is_reached_and_every_live_state_is_left() -> None:
    arrows = transitions()
    assert {to for _, to, _ in arrows} == set(STATES)
    sources = {source for source, _, _ in arrows} - {NEW}
    assert set(STATES) - sources == {"succeeded"}  # terminal, and no dead retry for it
    for source, to, _ in arrows:
        assert source in STATES or source == NEW, source
        assert to != source


def test_every_statement_named_is_one_of_sql() -> None:
    known = sql_names()
    named = {name for _, _, cell in transitions() if cell != "the clock" for name in _names(cell)}
    assert named, "the table names no statement"
    assert named - known == set(), f"not statements of sql/queries*.sql: {named - known}"
    for _, _, cell in transitions():
        assert cell == "the clock" or _names(cell), cell


def test_the_diagram_draws_the_tables_arrows() -> None:
    assert diagram_arrows() == {(source, to) for source, to, _ in transitions()}
