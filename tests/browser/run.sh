#!/usr/bin/env bash
# The dashboard's browser tests (pytest --browser): headless Chromium from Debian, driven by
# Playwright for Python. Playwright's own browser download does not work on these machines,
# so `playwright install` is never called; the tests use /usr/bin/chromium.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || {
    apt-get update -qq || true
    apt-get install -y -qq --no-install-recommends chromium >/dev/null || true
  }
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "tests/browser/run.sh: SKIPPED the browser tests: /usr/bin/chromium could not be installed" >&2
  exit 0
fi
if ! python3 -m pip install -q --disable-pip-version-check -e '.[test,web]' playwright; then
  echo "tests/browser/run.sh: SKIPPED the browser tests: pip could not install playwright" >&2
  exit 0
fi
exec python3 -m pytest -q --browser tests/test_dashboard_browser.py "$@"
