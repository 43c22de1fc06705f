"""The machinery that runs the documentation's code examples (tests/test_docs_examples.py).

Every fenced block of README.md and docs/**/*.md that is code (python, sh, sql) runs, in page
order, against a fresh database of the suite's PostgreSQL, unless the line before it says
why not: `<!-- skip: next "the reason" -->` (Sybil's skip directive). Blocks of any other
language (text, output, diagrams) are not examples. Sybil finds the blocks and keeps one
namespace per page; what runs them is here:

- ```python: executed in the page's namespace (top-level `await` runs on the page's event
  loop). The namespace starts with `slotd`, `timedelta`, `conn` (a psycopg 3 connection in
  autocommit mode to the page's database, with slotd migrated), `registry` (an empty
  `slotd.Registry()`) and `start_worker(registry)`, which drains that registry's tasks in a
  thread through slotd's own processor (`slotd.testing.ManualQueue`) until the page ends.
  `<!-- invisible-code-block: python ... -->` adds set-up or checks a reader does not see.
- ```python title="NAME.py": the file the reader is asked to save: written into the page's
  working directory (`append="true"` adds to it), which is on sys.path and PYTHONPATH.
- ```sh: run by bash (-euo pipefail) in that directory with SLOTD_DATABASE_URL set to the
  page's database; a non-zero exit fails the page. Its output is `sh_output` for a later
  invisible check. After `<!-- run: background -->` the block is one long-running command
  (`slotd run ...`): started, awaited until it logs `serving`, stopped at the next
  background block or at the end of the page.
- ```sql: executed on `conn`.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from sybil import Document, Example, Region, Sybil
from sybil.parsers.abstract import AbstractCodeBlockParser
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

import slotd

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_LANGUAGES = ("python", "sh", "sql")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^\n`]*)$", re.M)
SKIP = re.compile(r'<!-- skip: next "(?P<reason>[^"]+)" -->\s*$')
BACKGROUND = "<!-- run: background -->"
READY = re.compile(r"\bserving\b")
# Commands that change the machine itself: never run by the suite, whatever a page says; a
# block holding one must carry a skip with its reason.
MACHINE_CHANGING = re.compile(
    r"\b(pip install|useradd|systemctl|install -m|helm|curl|uvicorn|apt-get)\b|/etc/"
)


def pages() -> list[Path]:
    """README.md and every page of the site (docs/ARCHITECTURE.md is included by one)."""
    found = sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "ARCHITECTURE.md")
    return [ROOT / "README.md", *found]


@dataclass
class Block:
    line: int
    language: str
    info: str
    skip_reason: str | None


def fenced_blocks(text: str) -> list[Block]:
    """Each fenced block's opening line, its language and the skip reason just above it."""
    blocks: list[Block] = []
    lines = text.splitlines()
    open_fence: str | None = None
    for number, line in enumerate(lines, start=1):
        match = FENCE.match(line)
        if not match:
            continue
        if open_fence is not None:
            if match.group("fence").startswith(open_fence) and not match.group("info").strip():
                open_fence = None
            continue
        open_fence = match.group("fence")
        info = match.group("info").strip()
        language = info.split()[0] if info else ""
        above = lines[number - 2] if number >= 2 else ""
        skipped = SKIP.search(above)
        blocks.append(Block(number, language, info, skipped.group("reason") if skipped else None))
    return blocks


# the page's run


@dataclass
class PageRun:
    """What one page's examples share: its database, directory, loop and daemons."""

    url: str
    workdir: Path
    env: dict[str, str]
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: list[tuple[threading.Thread, threading.Event]] = field(default_factory=list)
    connections: list[psycopg.Connection[Any]] = field(default_factory=list)
    executed: int = 0
    skipped: int = 0
    background_next: bool = False

    def start_worker(self, registry: slotd.Registry) -> None:
        from slotd.testing import ManualQueue

        stop = threading.Event()
        conn = psycopg.connect(self.url, autocommit=True)
        self.connections.append(conn)
        queue = ManualQueue(conn, registry)

        def drain() -> None:
            while not stop.is_set():
                if not queue.deliver_all():
                    stop.wait(0.05)

        thread = threading.Thread(target=drain, name="docs-worker", daemon=True)
        thread.start()
        self.workers.append((thread, stop))

    def stop_background(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.background.clear()

    def close(self) -> None:
        self.stop_background()
        for thread, stop in self.workers:
            stop.set()
            thread.join(timeout=30)
        for conn in self.connections:
            conn.close()
        self.loop.close()


def run_python(example: Example) -> None:
    run: PageRun = example.namespace["__page__"]
    source = str(example.parsed)
    tree = ast.parse(source, filename=example.path, mode="exec")
    ast.increment_lineno(tree, example.line)
    code = compile(tree, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        run.loop.run_until_complete(eval(code, example.namespace))  # noqa: S307 - the page's code
    else:
        exec(code, example.namespace)  # noqa: S102 - the page's own code
    run.executed += 1


def run_sh(example: Example) -> None:
    run: PageRun = example.namespace["__page__"]
    source = str(example.parsed)
    changes = MACHINE_CHANGING.search(source)
    assert not changes, (
        f"{example.path}:{example.line}: `{changes.group(0)}` would change this machine: "
        'mark the block <!-- skip: next "why" -->'
    )
    if run.background_next:
        run.background_next = False
        start_background(run, source.strip(), example)
        run.executed += 1
        return
    # Its own session, so a block that hangs is ended with every process it started (a
    # `slotd run` left in a foreground block would otherwise outlive the test).
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", source],
        cwd=run.workdir,
        env=run.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    where = f"{example.path}:{example.line}"
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{where}: still running after 180 s\n{stdout}{stderr}") from None
    assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{stdout}{stderr}"
    example.namespace["sh_output"] = stdout + stderr
    run.executed += 1


def start_background(run: PageRun, command: str, example: Example) -> None:
    assert "\n" not in command, f"{example.path}:{example.line}: one command per background block"
    run.stop_background()
    log = run.workdir / f"background-{example.line}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=run.workdir,
            env=run.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    run.background.append(proc)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if READY.search(text):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{example.path}:{example.line}: `{command}` exited\n{text}")
        time.sleep(0.1)  # polling a log file: no event to wait on across processes
    raise AssertionError(f"{example.path}:{example.line}: `{command}` never served\n{text}")


def run_sql(example: Example) -> None:
    run: PageRun = example.namespace["__page__"]
    with psycopg.connect(run.url, autocommit=True) as conn:
        conn.execute(str(example.parsed).encode())
    run.executed += 1


def write_file(example: Example) -> None:
    run: PageRun = example.namespace["__page__"]
    info = example.region.lexemes["arguments"]
    name = re.search(r'title="([^"]+)"', info)
    assert name, f"{example.path}:{example.line}: a titled block names its file"
    path = run.workdir / name.group(1)
    mode = "a" if 'append="true"' in info else "w"
    with path.open(mode) as out:
        out.write(str(example.parsed))
    sys.modules.pop(path.stem, None)  # the next import reads the file as it is now
    run.executed += 1


def mark_background(example: Example) -> None:
    example.namespace["__page__"].background_next = True


class TitledPythonParser(AbstractCodeBlockParser):
    """```python title="tasks.py": a file to save, not code to run."""

    language = "python"

    def __init__(self) -> None:
        super().__init__(
            [
                FencedCodeBlockLexer(
                    language=r".+", mapping={"language": "arguments", "source": "source"}
                )
            ],
            evaluator=write_file,
        )

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.lexers(document):
            if re.match(r'python\s+title="', region.lexemes["arguments"]):
                region.parsed = region.lexemes["source"]
                region.evaluator = write_file
                yield region


class BackgroundParser:
    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="run", arguments="background")

    def __call__(self, document: Document) -> Iterator[Region]:
        for lexed in self.lexer(document):
            yield Region(lexed.start, lexed.end, None, mark_background)


SYBIL = Sybil(
    parsers=[
        CodeBlockParser("python", run_python),
        TitledPythonParser(),
        CodeBlockParser("sh", run_sh),
        CodeBlockParser("sql", run_sql),
        SkipParser(),
        BackgroundParser(),
    ],
    path=str(ROOT),
)


@contextmanager
def page_run(url: str, workdir: Path) -> Iterator[PageRun]:
    env = {
        **os.environ,
        "SLOTD_DATABASE_URL": url,
        # Two pages' daemons, or another suite's, must not meet on the metrics port.
        "SLOTD_METRICS_ADDR": "127.0.0.1:0",
        "PYTHONPATH": os.pathsep.join([str(workdir), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = PageRun(url=url, workdir=workdir, env=env)
    try:
        yield run
    finally:
        run.close()


def run_page(path: Path, url: str, workdir: Path) -> PageRun:
    """Every example of one page, in order, in one namespace; SkipTest for a skipped block
    is counted, not raised."""
    from unittest import SkipTest

    document = SYBIL.parse(path)
    saved_path, saved_cwd = list(sys.path), os.getcwd()
    sys.path[:0] = [str(workdir), str(ROOT)]
    os.chdir(workdir)
    saved_env = {k: os.environ.get(k) for k in ("SLOTD_DATABASE_URL", "SLOTD_METRICS_ADDR")}
    os.environ["SLOTD_DATABASE_URL"] = url
    os.environ["SLOTD_METRICS_ADDR"] = "127.0.0.1:0"
    try:
        with page_run(url, workdir) as run, psycopg.connect(url, autocommit=True) as conn:
            document.namespace.update(
                __page__=run,
                __name__="__docs__",
                slotd=slotd,
                timedelta=timedelta,
                conn=conn,
                registry=slotd.Registry(),
                start_worker=run.start_worker,
            )
            for example in document:
                try:
                    example.evaluate()
                except SkipTest:
                    run.skipped += 1
            return run
    finally:
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
