#!/usr/bin/env bash
# Runs the whole test suite RUNS times in a row (default 5) while stress-ng
# keeps every core busy, to show that the tests wait for events and not for the
# clock: a test that passes only on a fast or idle machine fails here. COUNT
# (default 1) is go test's -count. Stops at the first failing run.
#
#   make test-under-load                 five runs under the hog
#   make test-under-load RUNS=1 COUNT=3  one run with every test three times
#
# stress-ng comes from Debian's package (installed when run as root). The
# services come up as for make test. The long-outage test's outage is 30 s here
# (OUTBOX_TEST_OUTAGE; 5 minutes in make test).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
count=${COUNT:-1}
# The long-outage test holds RabbitMQ down for 5 minutes of wall clock, which
# no load changes; 30 s keeps five runs near half an hour. Set it to 5m for the
# full length.
export OUTBOX_TEST_OUTAGE=${OUTBOX_TEST_OUTAGE:-30s}

if ! command -v stress-ng >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "stress-ng is not installed: run as root (or with sudo): apt-get install -y stress-ng" >&2
    exit 1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng; } >/dev/null
fi
scripts/services.sh test
set -a; [ ! -f .services.env ] || . ./.services.env; set +a

# One CPU-bound worker per core, for as long as the tests run.
stress-ng --cpu "$(nproc)" --timeout 0 --quiet &
hog=$!
trap 'kill $hog 2>/dev/null; wait $hog 2>/dev/null || true' EXIT

for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  printf '\n== run %d of %d under stress-ng --cpu %d (go test -count=%d)\n' "$i" "$runs" "$(nproc)" "$count"
  go test -race -count="$count" -timeout 60m ./...
  printf '== run %d passed in %ds\n' "$i" "$(( $(date +%s) - start ))"
done
