# outbox sweeper: build, run, test, benchmark.
#
#   make run     migrate the local database, write demo messages, relay them to stdout
#   make test    every test, with the race detector, against the local Postgres
#   make bench   the benchmarks: drains, instances, page query, latency, RSS (see BENCHMARKS.md)

BIN          := bin/sweeper
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS      := -s -w -X github.com/outbox-sweeper/sweeper/internal/cli.Version=$(VERSION)
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BENCHSTAT    := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

.PHONY: build run test bench vet check-deploy clean

build:
	go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/sweeper

run: build
	$(BIN) migrate --database-url '$(DATABASE_URL)'
	@command -v psql >/dev/null || { echo "make run needs psql to write the demo messages (apt-get install postgresql-client)"; exit 1; }
	psql -q '$(DATABASE_URL)' -f sql/examples/demo.sql
	@echo "relaying; the messages follow as JSON lines. Ctrl-C stops."
	$(BIN) run --database-url '$(DATABASE_URL)'

vet:
	go vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }

# Every YAML and JSON file under deploy/ must parse (deploy/deploy_test.go), and
# the Prometheus rules must load. promtool comes with Debian's prometheus
# package (.ci/run installs it).
check-deploy:
	go test -count=1 ./deploy/
	@command -v promtool >/dev/null || { echo "check-deploy needs promtool: apt-get install prometheus (bash .ci/run does)"; exit 1; }
	promtool check rules deploy/prometheus/alerts.yml

test: vet check-deploy
	go test -race -count=1 -timeout 20m ./...

# Drain: each run loads a fresh backlog and drains it once (-benchtime 1x), three
# runs for a median; into a producer that accepts everything (outbox/), with 1, 2
# and 3 sweepers (DrainInstances), and into RabbitMQ and NATS JetStream
# (test/bench/). PageQuery: the page query alone, at two table sizes, and with
# 10,000,000 dispatched rows kept (PageQueryRetained: loading them takes minutes).
# test/bench/ also measures commit-to-arrival latency at 1,000 commits a second
# (LatencyNATS, 20 s a run) and the binary's peak RSS on a 1,000,000-row backlog.
# MessageIDIndex: the unique index's cost on writes and on a sweep; Split: finding
# one bad row in a 500-row batch. DrainBinary runs the binary on 100,000 rows; set
# OUTBOX_BENCH_BASE=<rev> to alternate it with an older build (see BENCHMARKS.md).
bench:
	go test -run '^$$' -bench 'Drain' -benchtime 1x -count 3 -timeout 30m ./outbox/ | tee bench.out
	go test -run '^$$' -bench 'PageQuery|TopicsQuery' -benchtime 2000x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	go test -run '^$$' -bench 'BlockedTick' -benchtime 100000x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	go test -run '^$$' -bench 'WriteMessageIDIndex$$' -benchtime 100x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	go test -run '^$$' -bench 'SweepMessageIDIndex' -benchtime 5x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	go test -run '^$$' -bench 'Split' -benchtime 20x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	go test -run '^$$' -bench . -benchtime 1x -count 3 -timeout 30m ./test/bench/ | tee -a bench.out
	go run $(BENCHSTAT) bench.out

clean:
	rm -rf bin bench.out
