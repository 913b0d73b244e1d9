package relay_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	"github.com/outbox-sweeper/sweeper/relay"
)

// An application can relay its outbox from its own process: one Relay runs
// the sweeper with retention, the dead-letter probe and, given an address,
// the admin API, and Run returns once all of it has stopped. Here the broker
// is the memory producer, and the application stops the relay once its
// messages are through; a service would cancel ctx on SIGTERM instead
// (signal.NotifyContext).
func Example() {
	pool, tbl := dbtest.ExampleOutbox() // a pgxpool.Pool, and outbox.Migrate(ctx, conn, tbl) done
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// What the application wrote (in its own transactions, as outbox's
	// examples show) waits in the outbox.
	w, err := outbox.NewWriter(tbl)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Write(ctx, pool, outbox.Message{Topic: "orders", Payload: []byte("order 1 paid")},
		outbox.Message{Topic: "invoices", Payload: []byte("invoice 7 due")}); err != nil {
		log.Fatal(err)
	}

	prod := memory.New(memory.Config{})
	r, err := relay.New(pool, prod, relay.Options{
		Sweeper: outbox.Config{Table: tbl, Tick: 50 * time.Millisecond},
		// Run closes the broker breaker, and the producer, once nothing
		// sends through them.
		Dependency: breaker.NewDependency(breaker.DependencyConfig{}),
		// Admin: admin.Config{Addr: admin.AddrDefault, Token: token} serves
		// health, readiness, metrics and the operators' API.
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for len(prod.Messages()) < 2 { // polls for the event: both messages sent
			time.Sleep(10 * time.Millisecond)
		}
		stop()
	}()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
	for _, m := range prod.Messages() {
		fmt.Printf("%s: %s\n", m.Topic, m.Payload)
	}
	// Unordered output:
	// orders: order 1 paid
	// invoices: invoice 7 due
}
