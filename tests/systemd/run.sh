#!/usr/bin/env bash
# The systemd boot tests (pytest --systemd): the units in systemd/ under a real systemd as
# PID 1 in systemd-nspawn. Installs systemd-container when missing; skips, saying why, only
# when it cannot be installed or the machine cannot boot a container (no root).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v systemd-nspawn >/dev/null && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends systemd-container >/dev/null 2>&1 || {
    apt-get update -qq || true
    apt-get install -y -qq --no-install-recommends systemd-container >/dev/null || true
  }
fi
if ! command -v systemd-nspawn >/dev/null; then
  echo "tests/systemd/run.sh: SKIPPED the systemd boot tests: systemd-nspawn could not be installed" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "tests/systemd/run.sh: SKIPPED the systemd boot tests: booting a container needs root" >&2
  exit 0
fi
exec python3 -m pytest -q -s --systemd tests/test_nspawn.py "$@"
