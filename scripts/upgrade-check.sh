#!/usr/bin/env bash
# The online upgrade of issue 32, on a table of millions of rows, as an
# operator would run it: an outbox at schema version 7 (OLD_BIN migrates it)
# with ROWS rows (default 5,000,000; all but 50,000 dispatched), the old
# sweeper relaying it to stdout, pgbench writing 200 single-row transactions a
# second for 40 s; 10 s in, NEW_BIN migrates, its sweeper starts beside the
# old one, which stops 5 s later. It prints how long migrate took, the writers'
# worst latency (pgbench's per-transaction log), and how often each message_id
# was delivered across both sweepers' output: every row exactly once.
#
#   OLD_BIN=/tmp/old/bin/sweeper NEW_BIN=bin/sweeper scripts/upgrade-check.sh
#
# Needs the machine's Postgres (DATABASE_URL) and pgbench; uses schema upg,
# dropped at the end.
set -u
: "${OLD_BIN:?set OLD_BIN to a sweeper built at schema version 7, e.g. 1b0de33}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
U=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
S=upg
psql -q "$U" -c "DROP SCHEMA IF EXISTS $S CASCADE" 2>/dev/null
$OLD_BIN migrate --database-url "$U" --schema $S >/dev/null
psql -q "$U" -c "INSERT INTO $S.outbox (topic, payload) SELECT 't' || (g % 10), convert_to(repeat('x', 512), 'UTF8') FROM generate_series(1,${ROWS:-5000000}) g" \
  -c "UPDATE $S.outbox SET dispatched_at = now() WHERE id <= ${ROWS:-5000000} - 50000" -c "VACUUM ANALYZE $S.outbox"
echo "loaded: $(psql -qAt "$U" -c "SELECT count(*) FILTER (WHERE dispatched_at IS NULL), count(*) FROM $S.outbox")"
$OLD_BIN run --database-url "$U" --schema $S --producer stdout --admin-addr '' --log-level warn > $tmp/upg-old.out 2>$tmp/upg-old.err &
old=$!
echo "INSERT INTO $S.outbox (topic, payload) VALUES ('t' || (random()*9)::int, '\x01');" > $tmp/upg-insert.sql
(cd $tmp && pgbench -n -R 200 -T 40 -c 2 -f $tmp/upg-insert.sql -l "$U" > $tmp/upg-pgbench.out 2>&1) &
bench=$!
sleep 10
start=$(date +%s.%N); ${NEW_BIN:-bin/sweeper} migrate --database-url "$U" --schema $S > $tmp/upg-migrate.out 2>&1; echo "migrate rc $? in $(echo "$(date +%s.%N) - $start" | bc) s: $(tail -1 $tmp/upg-migrate.out | cut -c1-150)"
${NEW_BIN:-bin/sweeper} run --database-url "$U" --schema $S --producer stdout --admin-addr '' --log-level warn > $tmp/upg-new.out 2>$tmp/upg-new.err &
new=$!
sleep 5; kill -TERM $old; wait $old; echo "old sweeper exited $?"
wait $bench
for i in $(seq 1 120); do n=$(psql -qAt "$U" -c "SELECT count(*) FROM $S.outbox WHERE dispatched_at IS NULL"); [ "$n" = 0 ] && break; sleep 1; done
echo "outstanding at end: $n"
kill -TERM $new; wait $new
echo "pgbench: $(grep -E 'number of transactions actually|latency average|maximum' $tmp/upg-pgbench.out | tr '\n' ' ')"
echo "max insert latency (us): $(cat $tmp/pgbench_log.* | awk '{print $3}' | sort -n | tail -1)"
cat $tmp/upg-old.out $tmp/upg-new.out | grep -o '"message_id":"[^"]*"' | sort | uniq -c | awk '{c[$1>1?"dup":"once"]++} END {print "delivered once:", c["once"]+0, " more than once:", c["dup"]+0}'
echo "expected: 50000 + the transactions pgbench processed"
psql -qAt "$U" -c "SELECT 'history rows', count(*) FROM $S.outbox_history" 
psql -q "$U" -c "DROP SCHEMA $S CASCADE" 2>/dev/null
