#!/usr/bin/env bash
# The README's two set-up commands in a fresh virtualenv, the test command included
# (pytest --fresh-venv): it installs every extra the suite needs from the package index,
# minutes, so it runs here rather than in the default suite (which runs the demo command).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 -m pytest -q -s --fresh-venv tests/test_fresh_venv.py "$@"
