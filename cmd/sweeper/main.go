// Command sweeper relays messages from a transactional outbox table in Postgres
// to a message broker. Run `sweeper help` for its commands and flags; docs/
// has the operator's guide (README.md maps it).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-sweeper/sweeper/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}
