#!/bin/bash
# The application's commits into one hot tenant (1,000 single-row commits a
# second from pgbench, 20 s a round) while a relay of many outboxes
# (--schemas 'tenant_*', 10 tenants) runs, for two binaries of the sweeper
# alternated round by round: BENCHMARKS.md, "a busy tenant's awake lock".
# Usage: scripts/hot-tenant-commits.sh OLD_BINARY NEW_BINARY [ROUNDS]
# Needs pgbench and psql, and a Postgres at 127.0.0.1:5432 (user postgres);
# it makes and leaves a database named hotab.
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2") rounds=${3:-3}
db=postgres://postgres@127.0.0.1:5432/hotab?sslmode=disable
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS hotab" -c "CREATE DATABASE hotab"
for i in $(seq -w 0 9); do psql -h 127.0.0.1 -U postgres -d hotab -qc "CREATE SCHEMA tenant_0$i"; done
"$new" migrate --database-url "$db" --schemas 'tenant_*' >/dev/null
echo "INSERT INTO tenant_00.outbox (topic, payload) VALUES ('orders', '\x7b7d');" > "$dir/insert.sql"
cd "$dir"
for round in $(seq "$rounds"); do
	for which in old new; do
		bin=$old
		[ "$which" = new ] && bin=$new
		"$bin" run --database-url "$db" --schemas 'tenant_*' --producer stdout --admin-addr "" >/dev/null 2>relay.err &
		pid=$!
		for _ in $(seq 150); do grep -q "relaying outboxes" relay.err && break; sleep 0.2; done
		rm -f pgbench_log.*
		pgbench -h 127.0.0.1 -U postgres -n -c 8 -j 2 -R 1000 -T 20 -f insert.sql -l hotab >/dev/null 2>&1
		kill "$pid"
		wait "$pid" || true
		printf 'round %s %s: ' "$round" "$which"
		awk '{print $3}' pgbench_log.* | sort -n | awk '{a[NR]=$1} END {printf "commits %d, p50 %.2f ms, p99 %.2f ms, p99.9 %.1f ms\n", NR, a[int(NR*0.5)]/1000, a[int(NR*0.99)]/1000, a[int(NR*0.999)]/1000}'
	done
done
