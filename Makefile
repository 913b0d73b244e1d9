# outbox sweeper: build, run, test, benchmark.
#
#   make run     bring up Postgres, migrate, write demo messages, relay them to stdout
#   make run-tenants  the same with three tenant schemas relayed by one process
#   make test    bring up Postgres, RabbitMQ, NATS, Redis and promtool, then every
#                test, with the race detector
#
# scripts/services.sh brings the services up (installing them from Debian's
# packages when run as root; otherwise it says what to run). When Postgres wants
# a password over TCP it writes the URLs to use to .services.env, read here.
#   make bench   the benchmarks: drains, instances, page query, latency, RSS, tenants, soak (see BENCHMARKS.md)
#   make soak    the soak of issue 32: bin/sweeper at 3,000 rows/s on a Postgres of its own
#                (autovacuum on), clean / a held snapshot / recovery, 2 min each, beside the
#                claim-and-mark ceiling; SOAK_MODE=clean|step|ceiling, SOAK_BIN=old binary,
#                SOAK_ARGS='-phase 20s -sweeper-args "--tick 100ms"' (see BENCHMARKS.md)

BIN          := bin/sweeper
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS      := -s -w -X github.com/outbox-sweeper/sweeper/internal/cli.Version=$(VERSION)
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BENCHSTAT    := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

# bash with pipefail: a recipe that pipes go test into tee fails when go test
# does (with sh, a failed benchmark printed FAIL and make said nothing).
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: build run run-tenants test test-under-load services bench bench-binary bench-tenants soak vet check-deploy clean

# Loads .services.env (if scripts/services.sh wrote one) into a recipe line:
# each of its variables that the environment does not set already, so that an
# OUTBOX_TEST_DATABASE_URL exported by hand wins, as the README says.
LOADENV := [ ! -f .services.env ] || while IFS='=' read -r k v; do [ -n "$$k" ] && [ -z "$${!k:-}" ] && export "$$k=$$v"; done < .services.env;

build:
	go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/sweeper

run: build
	scripts/services.sh run
	@$(LOADENV) url='$(DATABASE_URL)'; \
	  if [ '$(origin DATABASE_URL)' = file ]; then url=$${OUTBOX_DATABASE_URL:-$${RUN_DATABASE_URL:-$$url}}; fi; \
	  set -x; $(BIN) migrate --database-url "$$url" && psql -q "$$url" -f sql/examples/demo.sql && \
	  { set +x; echo "relaying; the messages follow as JSON lines. Ctrl-C stops."; } && \
	  exec $(BIN) run --database-url "$$url"

# The same with an outbox per tenant: three tenant schemas, each migrated and
# given a message, relayed by one process under each tenant's name.
run-tenants: build
	scripts/services.sh run
	@$(LOADENV) url='$(DATABASE_URL)'; \
	  if [ '$(origin DATABASE_URL)' = file ]; then url=$${OUTBOX_DATABASE_URL:-$${RUN_DATABASE_URL:-$$url}}; fi; \
	  set -x; psql -q "$$url" -f sql/examples/tenants.sql && $(BIN) migrate --database-url "$$url" --schemas 'demo_tenant_*' && \
	  psql -q "$$url" -f sql/examples/tenants_demo.sql && \
	  { set +x; echo "relaying the tenants; the messages follow as JSON lines. Ctrl-C stops."; } && \
	  exec $(BIN) run --database-url "$$url" --schemas 'demo_tenant_*' --destination '{schema}.{topic}'

vet:
	go vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }

# Every YAML and JSON file under deploy/ must parse (deploy/deploy_test.go), and
# the Prometheus rules must load and pass their tests (series in, alerts out). promtool comes with Debian's prometheus
# package (.ci/run installs it).
check-deploy:
	go test -count=1 ./deploy/
	@command -v promtool >/dev/null || { echo "check-deploy needs promtool: scripts/services.sh test installs it (make test runs that), or apt-get install prometheus"; exit 1; }
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

services:
	scripts/services.sh test

test: services vet check-deploy
	$(LOADENV) go test -race -count=1 -timeout 20m ./...

# The suite RUNS times (5) while stress-ng occupies every core; COUNT=3 runs
# each test three times. Proves the tests do not depend on the machine's speed.
test-under-load:
	RUNS=$(or $(RUNS),5) COUNT=$(or $(COUNT),1) scripts/under-load.sh

# Drain: each run loads a fresh backlog and drains it once (-benchtime 1x), three
# runs for a median; into a producer that accepts everything (outbox/), with 1, 2
# and 3 sweepers (DrainInstances), and into RabbitMQ and NATS JetStream
# (test/bench/). PageQuery: the page claim alone (rolled back), at two table sizes, and with
# 10,000,000 dispatched rows kept (PageQueryRetained: loading them takes minutes).
# StatusQuery: what GET /status asks the database, at 1,000 topics and up to a
# 1,000,000-row backlog.
# test/bench/ also measures the binary's peak RSS on a 1,000,000-row backlog.
# MessageIDIndex: the unique index's cost on writes and on a sweep; Split: finding
# one bad row in a 500-row batch. DrainKafka drains into franz-go's kfake (no
# target: kfake is not a cluster), and producer/kafka's Send reports the Kafka
# producer's allocations per message. DrainBinary runs the binary, with its defaults, on
# 100,000 rows into stdout, RabbitMQ and NATS, beside the ceilings of
# test/bench/ceiling (the database alone, each broker alone) measured in the same
# run, and reports its share of the combined ceiling (of-ceiling); Latency runs the
# binary at 1,000 commits a second into NATS and RabbitMQ. Set
# OUTBOX_BENCH_BASE=<rev> to alternate the binary with an older build (see
# BENCHMARKS.md). make bench-binary runs only those two.
# The tenant benchmarks (issue 33): 1,000 tenant schemas relayed by one binary
# (--schemas): idle cost, a quiet tenant's latency beside a busy one, 100
# tenants draining at once and all 1,000 draining small backlogs, each against
# the single-table binary in the same run; and slow tenants notifying against
# kept awake (--awake-rate). About 12 minutes on a 2-core machine; make bench
# runs them too.
bench-tenants:
	scripts/services.sh test
	$(LOADENV) go test -run '^$$' -bench '^BenchmarkTenants' -benchtime 1x -count 1 -timeout 30m ./test/bench/ | tee bench.out

bench-binary:
	scripts/services.sh test
	$(LOADENV) go test -run '^$$' -bench '^Benchmark(DrainBinary|Latency)' -benchtime 1x -count 3 -timeout 30m ./test/bench/ | tee bench.out
	go run $(BENCHSTAT) bench.out

bench:
	scripts/services.sh test
	$(LOADENV) go test -run '^$$' -bench 'Drain' -benchtime 1x -count 3 -timeout 30m ./outbox/ | tee bench.out
	$(LOADENV) go test -run '^$$' -bench 'PageQuery|TopicsQuery' -benchtime 2000x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench 'BlockedTick' -benchtime 100000x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench 'StatusQuery' -benchtime 20x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench 'WriteMessageIDIndex$$' -benchtime 100x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench 'SweepMessageIDIndex' -benchtime 5x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench 'Split' -benchtime 20x -count 3 -timeout 30m ./outbox/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench '^Benchmark(Drain|Latency|PeakRSS)' -benchtime 1x -count 3 -timeout 30m ./test/bench/ | tee -a bench.out
	$(LOADENV) go test -run '^$$' -bench '^BenchmarkTenants' -benchtime 1x -count 1 -timeout 30m ./test/bench/ | tee -a bench.out
	go test -run '^$$' -bench 'Send' -benchtime 20x -count 3 -timeout 30m ./producer/kafka/ | tee -a bench.out
	$(MAKE) --no-print-directory soak SOAK_MODE=phases SOAK_TEE='tee -a bench.out'
	go run $(BENCHSTAT) bench.out

# The soak (issue 32, test/soak/): starts a Postgres of its own (initdb's settings,
# autovacuum on) in a temporary directory and removes it at the end, Ctrl-C
# included; runs $(SOAK_BIN) as users do (migrate, then run --producer stdout,
# its output read through a pipe for end-to-end lag). Benchmark lines go to
# soak.out (bench.out under make bench), the 2-second samples to soak-samples.out.
SOAK_MODE ?= phases
SOAK_BIN  ?= $(BIN)
SOAK_ARGS ?=
SOAK_TEE  ?= tee soak.out
soak: build
	go run ./test/soak $(SOAK_MODE) --bin $(SOAK_BIN) $(SOAK_ARGS) | $(SOAK_TEE)

clean:
	rm -rf bin bench.out soak.out soak-samples.out
