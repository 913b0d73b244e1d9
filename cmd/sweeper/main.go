// Command sweeper relays messages from a transactional outbox table in Postgres
// to a message broker. Run `sweeper help` for its commands and flags; docs/
// has the operator's guide (README.md maps it).
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/outbox-sweeper/sweeper/internal/cli"
)

// gcPercent is the garbage collector's target when GOGC is not set. A relay's
// live heap is small (a few pages of rows) and every page allocates its rows
// again: at Go's default of 100 it collected many times a second during a
// drain, a quarter of the binary's CPU, and a 100,000-row drain took 1.1 times
// as long as at 400 (8 pairs, alternating; BENCHMARKS.md, issue 32). The
// price: the heap may grow to five times what is live rather than twice (a
// drain's peak RSS 50 MB rather than 37). GOGC and GOMEMLIMIT in the
// environment still rule; docs/configuration.md says so.
const gcPercent = 400

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	// SIGHUP re-reads a list of databases (the relay of many asks for it
	// then); otherwise it is ignored rather than ending the process at once,
	// its pages rolled back and sent again, as its default action did (a
	// terminal closed, a `systemctl reload`).
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts the graceful stop; a second one ends the
	// process at once (its default action), where it was swallowed while
	// the stop waited, say, on a broker client that ignores its deadline.
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}
