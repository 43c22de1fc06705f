"""`slotd run --app` naming an application that cannot be loaded: one line and exit 2, through
the real command line, whatever the import raised."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BROKEN = {
    # A setting read at import that the environment lacks: the commonest first-day failure.
    "settings_app.py": (
        "import os\nimport slotd\nregistry = slotd.Registry()\n"
        'DSN = os.environ["NO_SUCH_SETTING_FOR_SLOTD_TESTS"]\n'
    ),
    "typo_app.py": "import slotd\nregistry = slotd.Registry(\n",
    # The failure one module deeper, inside the application's own package.
    "shop/__init__.py": "from shop.config import LIMITS\n",
    "shop/config.py": 'import json\n\nLIMITS = json.loads("{")\n',
}


def slotd_run(app: str, cwd: Path, db_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTD_DATABASE_URL": db_url}
    env.pop("SLOTD_APP", None)
    return subprocess.run(
        [sys.executable, "-m", "slotd", "run", "--app", app],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    for name, text in BROKEN.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("app", "raised", "where"),
    [
        ("settings_app:registry", "KeyError: 'NO_SUCH_SETTING_", "settings_app.py, line 4"),
        ("typo_app:registry", "SyntaxError: '(' was never closed", "typo_app.py, line 2"),
        ("shop:registry", "JSONDecodeError: Expecting property name", "shop/config.py, line 3"),
    ],
)
def test_an_app_that_raises_at_import_is_one_line_exit_2(
    apps: Path, db_url: str, app: str, raised: str, where: str
) -> None:
    done = slotd_run(app, apps, db_url)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"slotd: bad --app '{app}': importing {app.split(':')[0]} raised ")
    assert raised in line
    assert f"{apps / where}" in line  # the application's own file and line, not importlib's
    assert "Traceback" not in done.stderr


def test_a_missing_module_is_the_same_shape(apps: Path, db_url: str) -> None:
    done = slotd_run("no_such_module_here:registry", apps, db_url)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "slotd: bad --app 'no_such_module_here:registry': cannot import no_such_module_here: "
        "No module named 'no_such_module_here'"
    ]
