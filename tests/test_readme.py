"""The README's set-up commands and CI's must not drift apart."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    commands = [line for block in blocks for line in block.splitlines() if "pytest" in line]
    assert commands, "the README names no test command"
    ci_commands = [
        line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")
    ]
    assert ci_commands == [commands[0]]
