# Build: docker build -t outbox-sweeper .
# Run:   docker run --rm -e OUTBOX_DATABASE_URL=postgres://user:pass@db:5432/app outbox-sweeper
#        docker run --rm -e OUTBOX_DATABASE_URL=… outbox-sweeper migrate
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
COPY --from=build /out/sweeper /usr/local/bin/sweeper
ENV OUTBOX_LOG_FORMAT=json
# The admin API (health, readiness, metrics). Set OUTBOX_ADMIN_ADDR=0.0.0.0:8080
# and OUTBOX_ADMIN_TOKEN to reach it from outside the container (see deploy/).
EXPOSE 8080
# Numeric, so Kubernetes can check runAsNonRoot (distroless "nonroot" is 65532).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sweeper"]
CMD ["run"]
