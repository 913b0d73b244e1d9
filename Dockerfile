# Build: docker build --build-arg VERSION=$(git describe --tags --always) -t outbox-sweeper .
# Run:   docker run --rm -e OUTBOX_DATABASE_URL=postgres://user:pass@db:5432/app \
#          -e OUTBOX_PRODUCER=rabbitmq -e OUTBOX_RABBITMQ_URL=amqp://user:pass@broker:5672/ outbox-sweeper
#        docker run --rm -e OUTBOX_DATABASE_URL=… outbox-sweeper migrate
# Name the producer: the default, stdout, prints every row to the container's
# log and counts it sent (for trying the sweeper out, not for an outbox of
# record).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/outbox-sweeper/sweeper/internal/cli.Version=${VERSION}" \
      -o /out/sweeper ./cmd/sweeper

# Static binary, no shell, non-root. Logs as JSON by default in a container.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=devel
ARG REVISION=unknown
LABEL org.opencontainers.image.title="outbox sweeper" \
      org.opencontainers.image.description="Relays messages from a transactional outbox table in Postgres to message brokers" \
      org.opencontainers.image.source="https://github.com/outbox-sweeper/sweeper" \
      org.opencontainers.image.documentation="https://github.com/outbox-sweeper/sweeper#readme" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/sweeper /usr/local/bin/sweeper
ENV OUTBOX_LOG_FORMAT=json
# The admin API (health, readiness, metrics). Set OUTBOX_ADMIN_ADDR=0.0.0.0:7488
# and OUTBOX_ADMIN_TOKEN to reach it from outside the container (see deploy/).
EXPOSE 7488
# No shell or curl in the image: the binary asks its own /healthz, at the
# OUTBOX_ADMIN_ADDR the sweeper listens on (loopback for a 0.0.0.0 address).
# Kubernetes ignores this and uses the manifest's probes.
HEALTHCHECK --interval=30s --timeout=6s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/sweeper", "healthcheck", "--timeout", "5s"]
# Numeric, so Kubernetes can check runAsNonRoot (distroless "nonroot" is 65532).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sweeper"]
CMD ["run"]
