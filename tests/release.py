"""The previous release, as the upgrade test runs it: the commit CHANGELOG.md names for
the newest released version, unpacked from this repository's history into a directory that
goes first on PYTHONPATH (it precedes the editable install, so `import slotd` and `python -m
slotd` load the old code; /work/shared/FIELD-NOTES.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    tree: Path  # holds slotd/ and sql/ of that commit

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose `slotd` is this release (ROOT after it, for tests.apps)."""
        return {**os.environ, "PYTHONPATH": f"{self.tree}{os.pathsep}{ROOT}", **extra}

    def run(
        self, *args: str, env: dict[str, str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`slotd ARGS` of this release, from its own tree (the cwd leads sys.path)."""
        return subprocess.run(
            [sys.executable, "-m", "slotd", *args],
            env={**self.env(), **env},
            cwd=self.tree,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def previous_release() -> tuple[str, str]:
    """(version, commit) of the newest `## [x.y.z]` section of CHANGELOG.md: its first
    paragraph names the commit it was cut from ("The code of commit 1377d3e")."""
    text = (ROOT / "CHANGELOG.md").read_text()
    section = re.search(r"^## \[(\d[^\]]*)\][^\n]*\n(.*?)(?=^## \[|\Z)", text, re.M | re.S)
    if not section:
        raise AssertionError("CHANGELOG.md has no released version (## [x.y.z] - date)")
    commit = re.search(r"\bcommit ([0-9a-f]{7,40})\b", section.group(2))
    if not commit:
        raise AssertionError(
            f"CHANGELOG.md's [{section.group(1)}] section names no commit "
            '("The code of commit abc1234"): the upgrade test cannot find the release'
        )
    return section.group(1), commit.group(1)


def unpack(dest: Path) -> Release:
    version, commit = previous_release()
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise AssertionError(
            f"release {version} (commit {commit}, from CHANGELOG.md) is not in this clone's "
            "history: a shallow clone? run `git fetch --unshallow` (.ci/run does)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "slotd", "sql"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return Release(version, commit, dest)
