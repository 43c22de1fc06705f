#!/usr/bin/env bash
# Reproduces tests/bench/RESULTS.md's "public job-queue benchmark" runs: slotd beside
# procrastinate in hardbyte/postgresql-job-queue-benchmarking, natively (no Docker).
#
#   tests/bench/portable/run.sh HARNESS_CLONE [SCENARIO ...]
#
# HARNESS_CLONE: a git clone of the harness (any commit; it is checked out at $PIN).
# SCENARIOS: any of the names below (default: all, in this order).
#
# Needs: PostgreSQL 15 running on 127.0.0.1:15555 with a superuser bench/bench and the
# pgstattuple extension available (`start_pg` below makes one when PJQB_PGDATA is set),
# uv, and a Python >= 3.12 named by UV_PYTHON. Each run leaves the harness's run directory
# under HARNESS_CLONE/results/ and, beside this script's output, audit JSON (lost, twice;
# releases.py: attempts a shutdown's release cost) and `uptime`.
set -euo pipefail

PIN=93677ca
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(cd "$HERE/../../.." && pwd)"
HARNESS="$(cd "${1:?usage: run.sh HARNESS_CLONE [SCENARIO ...]}" && pwd)"
shift
OUT="${PJQB_OUT:-$HARNESS/slotd-runs}"
DSN_BASE="postgres://bench:bench@127.0.0.1:15555"

# Offered load and workers, identical for both systems. Chaos runs use two replicas at
# half the rate and half the workers each: RATE jobs/s and WORKERS workers per system in
# total. 20 jobs/s is what procrastinate sustained on the shared 2 cores of the recorded
# runs (100 jobs/s overloaded both there; see RESULTS.md).
RATE="${PJQB_RATE:-20}"
WORKERS="${PJQB_WORKERS:-8}"
export PRODUCER_PACING=adapter   # the procrastinate adapter paces itself; so does ours
export PRODUCER_BATCH_MAX=16     # both adapters' documented bulk-enqueue path
export PRODUCER_BATCH_MS=50
export MPLBACKEND=Agg
export UV_PYTHON_DOWNLOADS=never
export BENCH_EXTERNAL_PG=1 BENCH_NATIVE=1 BENCH_PG_HOST=127.0.0.1
export BENCH_PG_STOP_CMD="${BENCH_PG_STOP_CMD:-su postgres -c '/usr/lib/postgresql/15/bin/pg_ctl -D ${PJQB_PGDATA:-/var/lib/pjqb-pg/data} -m fast -w stop'}"
export BENCH_PG_START_CMD="${BENCH_PG_START_CMD:-su postgres -c '/usr/lib/postgresql/15/bin/pg_ctl -D ${PJQB_PGDATA:-/var/lib/pjqb-pg/data} -l ${PJQB_PGDATA:-/var/lib/pjqb-pg/data}/../log -w start'}"

start_pg() {
  # A private PostgreSQL 15 for the bench, as the postgres user, with the harness's
  # postgres.conf (its listen_addresses replaced by 127.0.0.1:15555).
  local data="${PJQB_PGDATA:?}" bin=/usr/lib/postgresql/15/bin
  if [ ! -d "$data" ]; then
    install -d -o postgres -g postgres "$(dirname "$data")"
    su postgres -c "$bin/initdb -D $data -U postgres --auth=trust -E UTF8" >/dev/null
    grep -v '^listen_addresses' "$HARNESS/postgres.conf" >>"$data/postgresql.conf"
    printf "listen_addresses = '127.0.0.1'\nport = 15555\nunix_socket_directories = '%s'\n" \
      "$(dirname "$data")" >>"$data/postgresql.conf"
  fi
  su postgres -c "$bin/pg_ctl -D $data -l $(dirname "$data")/log -w status" >/dev/null \
    || su postgres -c "$bin/pg_ctl -D $data -l $(dirname "$data")/log -w start" >/dev/null
  su postgres -c "psql -h $(dirname "$data") -p 15555 -tAc \"SELECT 1 FROM pg_roles WHERE rolname='bench'\"" | grep -q 1 \
    || su postgres -c "psql -h $(dirname "$data") -p 15555 -c \"CREATE ROLE bench LOGIN SUPERUSER PASSWORD 'bench'\""
}

prepare_harness() {
  cd "$HARNESS"
  # A clone of the mirror lacks three blobs under results/: restore everything else.
  # (After `git checkout $PIN`, a clone of the mirror lacks three blobs under results/:
  # `git restore --source=HEAD -- ':!results' && git reset -q` gives a work tree.)
  [ "$(git rev-parse --short=7 HEAD)" = "$PIN" ] || { echo "check the harness out at $PIN first" >&2; exit 2; }
  git checkout -q -- bench_harness
  git apply "$HERE/harness-native.patch"
  git apply "$HERE/adapters-slotd.patch"
  rm -rf slotd-bench
  mkdir slotd-bench
  cp "$HERE/slotd-bench/"{adapter.json,main.py,slotd_bench_app.py,pyproject.toml,uv.lock,README.md} slotd-bench/
  # The copy measures this checkout: point its path dependency here and re-lock (the
  # locked versions of everything else are kept).
  sed -i "s|path = \"../../../..\"|path = \"$CHECKOUT\"|" slotd-bench/pyproject.toml
  (cd slotd-bench && uv lock -q && uv sync --frozen -q)
  (cd procrastinate-bench && { [ -f uv.lock ] || uv lock -q; } && uv sync --frozen -q)
  uv sync --frozen -q
}

phases_for() {
  case "$1" in
    # The published scenario is 10m warmup, 60m clean, 60m idle-in-tx, 30m recovery.
    idle_in_tx_saturation) echo "--phase warmup=warmup:60s --phase clean_1=clean:2m --phase idle_1=idle-in-tx:10m --phase recovery_1=recovery:3m" ;;
    # Published: 10m warmup, 30m clean, 120m high-load (1.5x), 30m clean.
    sustained_high_load) echo "--phase warmup=warmup:60s --phase clean_1=clean:2m --phase pressure_1=high-load:4m --phase recovery_1=clean:2m" ;;
    chaos_*) echo "--scenario $1" ;;
    *) echo "unknown scenario $1" >&2; return 2 ;;
  esac
}

run_one() {
  local scenario="$1" replicas=1 rate=$RATE workers=$WORKERS
  case "$scenario" in chaos_*) replicas=2 rate=$((RATE / 2)) workers=$((WORKERS / 2)) ;; esac
  local dir="$OUT/$scenario"
  rm -rf "$dir"
  mkdir -p "$dir/ledger"
  export SLOTD_BENCH_LEDGER="$dir/ledger"
  # shellcheck disable=SC2046
  set -- bench run $(phases_for "$scenario") --systems slotd,procrastinate --fast --skip-build \
    --producer-rate "$rate" --worker-count "$workers" --replicas "$replicas"
  { date -u +%FT%TZ; uptime; echo "uv run $*"; } | tee "$dir/command.txt"
  (cd "$HARNESS" && uv run "$@") >"$dir/harness.out" 2>"$dir/harness.err" || echo "harness exit $?" | tee -a "$dir/command.txt"
  { date -u +%FT%TZ; uptime; } | tee -a "$dir/command.txt"
  ls -td "$HARNESS"/results/*/ | head -1 >"$dir/run_dir.txt"
  local py="$HARNESS/slotd-bench/.venv/bin/python"
  "$py" "$HERE/audit.py" --dsn "$DSN_BASE/slotd_bench" --system slotd --ledger "$dir/ledger" \
    --drain "$HARNESS/slotd-bench" >"$dir/audit-slotd.json"
  "$py" "$HERE/audit.py" --dsn "$DSN_BASE/procrastinate_bench" --system procrastinate \
    >"$dir/audit-procrastinate.json"
  # A claim that met a shutdown before its handler started must get its attempt back.
  "$py" "$HERE/releases.py" "$dir/harness.err" >"$dir/releases-slotd.json"
  cat "$dir/audit-slotd.json" "$dir/audit-procrastinate.json" "$dir/releases-slotd.json"
}

[ -n "${PJQB_PGDATA:-}" ] && start_pg
prepare_harness
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(chaos_crash_recovery chaos_repeated_kills chaos_postgres_restart
  chaos_pg_backend_kill chaos_pool_exhaustion idle_in_tx_saturation sustained_high_load)
for scenario in "${SCENARIOS[@]}"; do
  run_one "$scenario"
done
