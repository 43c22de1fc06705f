"""On PYTHONPATH, makes this interpreter (and every process it forks) one where the
opentelemetry packages are not installed: importing any of them raises ModuleNotFoundError,
as on a machine with plain `pip install slotd`. tests/test_without_otel.py uses it."""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from typing import Any


class NotInstalled(MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "opentelemetry" or fullname.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, NotInstalled())
