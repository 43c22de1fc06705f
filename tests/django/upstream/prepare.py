"""Django's own tests for `django.tasks`, adapted to run against slotd's backend.

`python tests/django/upstream/prepare.py` (with the Django under test installed) fetches the
sdist of that exact Django release from the package index (once per machine: it is kept in
${XDG_CACHE_HOME:-~/.cache}/slotd/django-tests/), applies ADAPTATION below to a copy of its
tests/tasks, and prints the directory holding the adapted package `tasks` (Django's own test
suite imports it under that name, and test_module_path checks it). tests/django/run.sh then
runs it with `pytest -p tests.django.upstream.plugin DIR`; the plugin (plugin.py) gives it
a PostgreSQL database migrated by `manage.py migrate` and skips the tests in INAPPLICABLE
(inapplicable.py), each with its reason.

The adaptation is the fewest changes that swap the backend, each one a literal replacement
that must be found (an upstream change that moves one fails here, loudly):
- Django's DummyBackend (keeps what is enqueued, runs nothing) becomes SlotdBackend with no
  worker running: a task stays READY, as with Dummy.
- Django's ImmediateBackend (runs the task inside enqueue) becomes
  slotd.contrib.django.testing.EagerBackend: the rows are written, then the task is
  claimed, run by the worker's own handler and settled, inside enqueue.
- SimpleTestCase becomes TransactionTestCase: a real queue writes to the database, which
  SimpleTestCase forbids; TransactionTestCase commits for real, so task_enqueued is sent
  as in production (a TestCase's transaction never commits).
- DummyBackend.clear() in setUp is dropped: the plugin empties slotd's tables before each
  test instead (the test of clear() itself is inapplicable).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

DUMMY = "django.tasks.backends.dummy.DummyBackend"
IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
SLOTD = "slotd.contrib.django.SlotdBackend"
EAGER = "slotd.contrib.django.testing.EagerBackend"
CLEAR_IN_SETUP = "    def setUp(self):\n        default_task_backend.clear()\n"
NO_CLEAR = "    def setUp(self):\n        pass  # slotd's tables are emptied before each test\n"

# file -> [(old, new)]: every `old` must occur in the file.
ADAPTATION: dict[str, list[tuple[str, str]]] = {
    "test_dummy_backend.py": [
        (f'"{DUMMY}"', f'"{SLOTD}"'),
        ("SimpleTestCase", "TransactionTestCase"),
        (CLEAR_IN_SETUP, NO_CLEAR),
    ],
    "test_immediate_backend.py": [
        (f'"{IMMEDIATE}"', f'"{EAGER}"'),
        ("SimpleTestCase", "TransactionTestCase"),
    ],
    "test_tasks.py": [
        (f'"{DUMMY}"', f'"{SLOTD}"'),
        (f'"{IMMEDIATE}"', f'"{EAGER}"'),
        ("SimpleTestCase", "TransactionTestCase"),
        (CLEAR_IN_SETUP, NO_CLEAR),
    ],
    # Django's base class with a backend defined in the test file: nothing to swap, run
    # as it is (it shows that the harness leaves Django's own behaviour alone).
    "test_custom_backend.py": [],
}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slotd" / "django-tests"


def pristine(version: str) -> Path:
    """Django `version`'s tests/tasks as released, fetched once."""
    home = cache_root() / f"django-{version}"
    tests = home / "tasks"
    if (tests / "tasks.py").exists():
        return tests
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        # The sdist holds Django's tests; the wheel does not.
        fetch = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        fetch += ["--no-binary", "django", f"django=={version}", "-d", tmp]
        subprocess.run(fetch, check=True, stdout=subprocess.DEVNULL)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/tests/tasks/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
            tar.extractall(tmp, members=members, filter="data")
        shutil.move(str(Path(tmp) / prefix), str(tests))
    return tests


def adapt(source: Path, dest: Path) -> None:
    """Copy `source` (Django's tests/tasks) to `dest`, ADAPTATION applied."""
    found = sorted(p.name for p in source.glob("test_*.py"))
    if found != sorted(ADAPTATION):
        known = sorted(ADAPTATION)
        raise SystemExit(f"Django's tests/tasks has {found}; the adaptation knows {known}")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest)
    for name, changes in ADAPTATION.items():
        path = dest / name
        text = path.read_text()
        for old, new in changes:
            if old not in text:
                raise SystemExit(f"{name}: {old.strip()!r} not found: adapt the adaptation")
            text = text.replace(old, new)
        path.write_text(text)


def main() -> None:
    import django

    version = django.get_version()
    out = cache_root() / f"django-{version}" / "adapted"
    adapt(pristine(version), out / "tasks")
    print(out)


if __name__ == "__main__":
    main()
