#!/usr/bin/env bash
# The Django integration's tests: Django 6 needs Python >= 3.12 while slotd's core supports
# 3.11, so they run in their own virtualenvs on pyenv's 3.12 (else 3.13), one per supported
# Django release line (DJANGO_LINES, default "6.0 6.1"): each line's newest patch release.
# Then Django's own tests/tasks of that release, adapted to slotd's backend
# (tests/django/upstream/prepare.py says how; inapplicable.py lists what cannot apply).
set -euo pipefail
cd "$(dirname "$0")/../.."

py=""
for candidate in python3.12 python3.13; do
  root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  found="$(ls "$root"/versions/3.1[23].*/bin/"$candidate" 2>/dev/null | head -1 || true)"
  if [ -n "$found" ]; then py="$found"; break; fi
  if command -v "$candidate" >/dev/null; then py="$(command -v "$candidate")"; break; fi
done
if [ -z "$py" ]; then
  echo "tests/django/run.sh: no Python 3.12 or 3.13 found (pyenv or PATH)" >&2
  exit 1
fi

for line in ${DJANGO_LINES:-6.0 6.1}; do
  venv=".venv-django-$line"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  # pip is skipped (~25 s a line) while the virtualenv already has this checkout's
  # dependencies: the stamp hashes pyproject.toml, the checkout's path, the line and the day
  # (a new patch release is picked up the next day).
  stamp="$(cat pyproject.toml <(pwd; echo "$line"; date +%F) | sha256sum | cut -c1-16)"
  if [ "$(cat "$venv/.slotd-stamp" 2>/dev/null)" != "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test,django]' \
      "django~=$line.0"
    echo "$stamp" > "$venv/.slotd-stamp"
  fi
  echo "== Django $("$venv/bin/python" -c 'import django; print(django.get_version())')"
  "$venv/bin/python" -m pytest -q tests/django "$@"
  upstream="$("$venv/bin/python" tests/django/upstream/prepare.py)"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -p tests.django.upstream.plugin "$upstream"
done
