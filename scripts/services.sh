#!/usr/bin/env bash
# Brings up what the sweeper's run and tests need on this machine, from
# Debian's packages: Postgres for `make run`; Postgres, RabbitMQ, NATS with
# JetStream, Redis, promtool, kcat and Chromium for `make test` and CI. (Kafka needs no
# server: the tests run franz-go's kfake, in process or as test/kfakeserver.) Idempotent and quick
# when everything is up. As root it installs and starts what is missing; as
# anyone else it says the command to run and fails.
#
#   scripts/services.sh run    Postgres (and psql)
#   scripts/services.sh test   everything the tests need
#
# When Postgres asks for a password over TCP (a fresh Debian install does), it
# gives the postgres role the password "postgres" and writes the URLs to use to
# .services.env, which the Makefile reads.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-test}
case "$what" in run|test) ;; *) echo "usage: $0 run|test" >&2; exit 2 ;; esac

log() { printf '== %s\n' "$*" >&2; }
root() { [ "$(id -u)" = 0 ]; }

apt_updated=""
need() { # need "what is missing" package...
  local why=$1; shift
  if ! root; then
    echo "$why: run as root (or with sudo): apt-get install -y $*" >&2
    exit 1
  fi
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  log "installing $* from Debian's packages ($why)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

start() { # start "name" command...
  local name=$1; shift
  if ! root; then
    echo "$name is not running: start it as root: $*" >&2
    exit 1
  fi
  log "starting $name"
  "$@"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # port name seconds
  for _ in $(seq 1 "$3"); do port_open "$1" && return 0; sleep 1; done
  echo "$2 did not start listening on 127.0.0.1:$1" >&2; return 1
}

pg_ready() { command -v pg_isready >/dev/null && pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

ensure_postgres() {
  if ! pg_ready; then
    if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
      need "no Postgres server" postgresql
    fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    start Postgres pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 60); do pg_ready && break; sleep 1; done
    pg_ready || { echo "Postgres did not start: see /var/log/postgresql/" >&2; exit 1; }
  fi
  command -v psql >/dev/null || need "no psql (make run writes the demo rows with it)" postgresql-client
  # The sweeper and the tests connect as postgres over TCP. A fresh Debian
  # install asks for a password there: give the role one and say so.
  rm -f .services.env
  # -w: a server that wants a password fails the probe rather than prompt.
  if ! psql -w "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -qAtc 'select 1' >/dev/null 2>&1 </dev/null; then
    if ! psql -w "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable" -qAtc 'select 1' >/dev/null 2>&1 </dev/null; then
      root || { echo "Postgres wants a password for postgres over TCP: as root, run su postgres -c \"psql -c \\\"ALTER ROLE postgres PASSWORD 'postgres'\\\"\"" >&2; exit 1; }
      log "Postgres wants a password over TCP: setting one for the postgres role"
      su postgres -c "psql -qc \"ALTER ROLE postgres PASSWORD 'postgres'\""
    fi
    local url="postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable"
    printf 'OUTBOX_TEST_DATABASE_URL=%s\nRUN_DATABASE_URL=%s\n' "$url" "$url" > .services.env
  fi
}

ensure_rabbitmq() {
  port_open 5672 && return
  command -v rabbitmq-server >/dev/null || need "no RabbitMQ" rabbitmq-server
  start RabbitMQ rabbitmq-server -detached || true
  wait_port 5672 RabbitMQ 90
  # The broker listens a moment before guest can log in: wait until it answers.
  for _ in $(seq 1 30); do rabbitmqctl -q status >/dev/null 2>&1 && break; sleep 1; done
}

# jetstream_up asks the NATS server on 4222 for its JetStream account info, in
# the protocol's own text: a server without JetStream (Debian's package starts
# one from its default config) never answers the request.
jetstream_up() { # [port]
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"${1:-4222}"' || exit 1
    printf "CONNECT {\"verbose\":false}\r\nSUB _INBOX.jsprobe 1\r\nPUB \$JS.API.INFO _INBOX.jsprobe 0\r\n\r\n" >&3
    while IFS= read -r -t 2 line <&3; do
      case $line in *account_info_response*|*jetstream*) exit 0 ;; esac
    done
    exit 1' 2>/dev/null
}

# stop_plain_nats stops the nats-server that listens on 4222 without
# JetStream: that one process (through systemd when it is the package's
# service), never another nats-server of the host, nor something else on the
# port.
stop_plain_nats() {
  root || { echo "a NATS server on 127.0.0.1:4222 has no JetStream: as root, stop it (systemctl stop nats-server) and run this again" >&2; exit 1; }
  local pid
  pid=$(ss -Hltnp 'sport = :4222' 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2)
  if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != nats-server ]; then
    echo "what listens on 127.0.0.1:4222 is no NATS server with JetStream, and not one this script can tell is nats-server: stop it, or free the port" >&2
    exit 1
  fi
  log "the NATS server on 4222 (pid $pid) has no JetStream: stopping it"
  if [ "$(systemctl show -p MainPID --value nats-server 2>/dev/null)" = "$pid" ]; then
    systemctl stop nats-server
  else
    kill "$pid"
  fi
  for _ in $(seq 1 30); do port_open 4222 || return 0; sleep 1; done
  echo "the NATS server on 4222 (pid $pid) did not stop" >&2; exit 1
}

ensure_nats() {
  # Debian's nats-server package starts its service without JetStream: such
  # a server is replaced by one with it.
  if port_open 4222; then
    jetstream_up && return
    stop_plain_nats
  fi
  command -v nats-server >/dev/null || need "no NATS server" nats-server
  # The package's own service, started at install, has no JetStream either.
  if port_open 4222 && ! jetstream_up; then
    stop_plain_nats
  fi
  mkdir -p /var/lib/nats-server 2>/dev/null || true
  start "NATS with JetStream" start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port 4222 NATS 30
  for _ in $(seq 1 30); do jetstream_up && return; sleep 1; done
  echo "NATS answers on 4222 without JetStream: see /var/log/nats-server.log" >&2; exit 1
}

ensure_redis() {
  port_open 6379 && return
  command -v redis-server >/dev/null || need "no Redis" redis-server
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  start Redis redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port 6379 Redis 30
}

ensure_chromium() {
  command -v chromium >/dev/null || need "no chromium (the console's browser test drives it headless)" chromium
}

ensure_kcat() {
  command -v kcat >/dev/null || need "no kcat (the Kafka tests read what the sweeper produced with it)" kcat
}

ensure_promtool() {
  command -v promtool >/dev/null || need "no promtool (make check-deploy checks the alert rules with it)" prometheus
}

# Every test makes and drops schemas (and some databases). A server with
# autovacuum off, as a development machine's may be, keeps their dead rows in
# the catalogs: a day of runs left pg_attribute at 55 MB, and statements that
# read the catalogs (DDL, the fleet's listings) slower by the evening than in
# the morning. Vacuumed before each run, every run starts from alike
# catalogs. Best effort: it needs a superuser (or the catalogs' owner).
vacuum_catalogs() {
  # The URL the tests use: the environment's, else the file's (as the
  # Makefile reads them), else the default.
  local url="${OUTBOX_TEST_DATABASE_URL:-}"
  if [ -z "$url" ] && [ -f .services.env ]; then
    url=$(sed -n 's/^OUTBOX_TEST_DATABASE_URL=//p' .services.env)
  fi
  url="${url:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}"
  psql -w "$url" -qAtc 'VACUUM pg_catalog.pg_class, pg_catalog.pg_attribute, pg_catalog.pg_depend,
    pg_catalog.pg_type, pg_catalog.pg_constraint, pg_catalog.pg_index, pg_catalog.pg_namespace' >/dev/null 2>&1 </dev/null ||
    log "could not vacuum the test database's catalogs (not a superuser?): tests run on as they are"
}

ensure_postgres
if [ "$what" = test ]; then
  # go test -race needs cgo, so a C compiler; make runs the suite.
  command -v gcc >/dev/null || need "no C compiler (go test -race needs cgo)" gcc
  command -v make >/dev/null || need "no make (make test runs the suite)" make
  vacuum_catalogs
  ensure_rabbitmq
  ensure_nats
  ensure_redis
  ensure_promtool
  ensure_kcat
  ensure_chromium
fi
log "services for $what are up"
