"""The reference pages' tables, generated from the code they describe: every command and
option from the click group (slotd.cli.main), every setting from its declaration
(slotd/environment.py). Each generated part of a page sits between two markers:

    <!-- generated: NAME (python3 tests/tools/reference_pages.py --write) -->
    ...
    <!-- end generated: NAME -->

and everything outside them is written by hand. `--write` rewrites the generated parts;
without it, prints the pages that are out of date and exits 1 (tests/test_reference_pages.py
fails the suite the same way).

Generated into the Markdown rather than at build time (an mkdocs hook or plugin) so that the
page reads the same in the repository as on the site (the README links to these files), a
change to an option or a setting shows in the same commit's diff of the page, and the check
costs a fraction of a second in the default suite instead of a site build."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from slotd.environment import SECTIONS, VARIABLES, Variable  # noqa: E402

COMMAND = "python3 tests/tools/reference_pages.py --write"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _variable_row(v: Variable) -> str:
    names = f"`{v.name}`"
    if v.fallback:
        names += " (else " + ", ".join(f"`{f}`" for f in v.fallback) + ")"
    if v.flag:
        names += f" (`{v.flag}`)"
    default = v.shown if v.shown is not None else f"`{v.default}`"
    return f"| {names} | {_cell(default)} | {_cell(v.meaning)} |"


def settings_tables() -> str:
    out: list[str] = []
    for section, about in SECTIONS.items():
        rows = [_variable_row(v) for v in VARIABLES if v.section == section]
        out += [f"## {section}", "", about, "", "| variable | default | meaning |"]
        out += ["| --- | --- | --- |", *rows, ""]
    return "\n".join(out)


def _commands(
    command: click.Command, path: list[str], parent: click.Context | None = None
) -> Iterator[tuple[str, click.Command, click.Context]]:
    ctx = click.Context(command, info_name=path[-1], parent=parent)
    yield " ".join(path), command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, [*path, name], ctx)


def _slug(title: str) -> str:
    # Python-Markdown's toc slug for a heading like "slotd dead retry".
    return re.sub(r"[^\w]+", "-", title.lower()).strip("-")


def _help(command: click.Command) -> str:
    text = inspect.cleandoc(command.help or "").split("\f", 1)[0]
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b")


def cli_reference() -> str:
    from slotd.cli import main

    commands = list(_commands(main, ["slotd"]))
    out = ["## At a glance", "", "| command | what it does |", "| --- | --- |"]
    for title, command, _ in commands[1:]:
        if isinstance(command, click.Group) and not command.invoke_without_command:
            continue  # its subcommands have the rows
        out.append(f"| [`{title}`](#{_slug(title)}) | {_cell(command.get_short_help_str(200))} |")
    out.append("")
    for title, command, ctx in commands:
        usage = " ".join([title, *command.collect_usage_pieces(ctx)])
        out += [f"## {title}", "", _help(command), "", "```text", usage, "```", ""]
        options = [
            record
            for param in command.get_params(ctx)
            if isinstance(param, click.Option) and not param.hidden
            for record in [param.get_help_record(ctx)]
            if record is not None and record[0] != "--help"
        ]
        if options:
            out += ["| option | what it does |", "| --- | --- |"]
            # A pipe inside a code span does not split a cell (Python-Markdown's tables),
            # and an escaped one would show its backslash: `--state [a|b]` as it is.
            out += [f"| `{opts}` | {_cell(help_text)} |" for opts, help_text in options]
            out.append("")
    return "\n".join(out)


PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "docs/reference/settings.md": ("settings", settings_tables),
    "docs/reference/cli.md": ("commands", cli_reference),
}


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- generated: {name} ({COMMAND}) -->\n", f"<!-- end generated: {name} -->"


def rendered(path: str) -> str:
    """The page at `path` with its generated part as the code says it is now."""
    name, generate = PAGES[path]
    text = (ROOT / path).read_text()
    start, end = _markers(name)
    if start not in text or end not in text:
        raise SystemExit(f"{path}: the markers of the generated part {name!r} are missing")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return before + start + "\n" + generate().rstrip("\n") + "\n\n" + end + after


def out_of_date() -> list[str]:
    return [path for path in PAGES if rendered(path) != (ROOT / path).read_text()]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path in PAGES:
            (ROOT / path).write_text(rendered(path))
        return 0
    stale = out_of_date()
    for path in stale:
        print(f"{path} is out of date: run {COMMAND}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
