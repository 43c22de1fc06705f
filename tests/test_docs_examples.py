"""Every code example of the README and the documentation site runs, against the suite's
PostgreSQL, or says why it cannot (tests/docs_examples.py has the rules): no example can rot
as the README's sliced handler once did."""

from __future__ import annotations

from pathlib import Path

import pytest

sybil = pytest.importorskip("sybil", reason="the docs' examples run with Sybil (test extra)")

from slotd.testing import ThrowawayPostgres  # noqa: E402
from tests.docs_examples import EXAMPLE_LANGUAGES, ROOT, fenced_blocks, pages  # noqa: E402

# Blocks that are not examples: a command's output, a log line, a diagram, a shipped file.
NOT_EXAMPLES = ("text", "yaml", "mermaid")


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_code_block_is_run_or_says_why_not() -> None:
    unmarked = []
    for path in pages():
        for block in fenced_blocks(path.read_text()):
            if block.language not in EXAMPLE_LANGUAGES + NOT_EXAMPLES:
                unmarked.append(
                    f"{page_id(path)}:{block.line}: ```{block.language}: name python, sh or"
                    " sql (run by the suite), text (output), yaml (a shipped file) or mermaid"
                    " (a diagram)"
                )
    assert not unmarked, "\n".join(unmarked)


def test_the_site_has_examples_and_runs_most_of_them() -> None:
    blocks = [b for p in pages() for b in fenced_blocks(p.read_text())]
    examples = [b for b in blocks if b.language in EXAMPLE_LANGUAGES]
    skipped = [b for b in examples if b.skip_reason]
    assert len(examples) >= 40
    assert len(skipped) * 3 < len(examples), "most examples run; a skip is the exception"


PAGES = [
    p for p in pages() if any(b.language in EXAMPLE_LANGUAGES for b in fenced_blocks(p.read_text()))
]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_pages_examples_run(page: Path, scratch_pg: ThrowawayPostgres, tmp_path: Path) -> None:
    from tests.docs_examples import run_page

    blocks = [b for b in fenced_blocks(page.read_text()) if b.language in EXAMPLE_LANGUAGES]
    run = run_page(page, scratch_pg.new_database(), tmp_path)
    assert run.executed + run.skipped >= len(blocks), (run.executed, run.skipped, len(blocks))
    assert run.skipped == sum(1 for b in blocks if b.skip_reason)
