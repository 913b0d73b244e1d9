package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// A sweeper relays what applications wrote to a producer: here the memory
// producer, which keeps what it was sent. Run sweeps every tick until its
// context ends; one Sweep is one tick's work.
func ExampleSweeper() {
	ctx := context.Background()
	pool, tbl := dbtest.ExampleOutbox() // a pgxpool.Pool, and outbox.Migrate(ctx, conn, tbl) done
	w, err := outbox.NewWriter(tbl)
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return w.Write(ctx, tx,
			outbox.Message{Topic: "orders", Payload: []byte("order 1 paid"), PartitionKey: "1"},
			outbox.Message{Topic: "orders", Payload: []byte("order 1 shipped"), PartitionKey: "1"},
			outbox.Message{Topic: "invoices", Payload: []byte("invoice 7 due")})
	})
	if err != nil {
		log.Fatal(err)
	}

	prod := memory.New(memory.Config{})
	s, err := outbox.NewSweeper(pool, prod, outbox.Config{Table: tbl})
	if err != nil {
		log.Fatal(err)
	}
	res, err := s.Sweep(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dispatched:", res.Dispatched)
	for _, m := range prod.Messages() {
		fmt.Printf("%s: %s\n", m.Topic, m.Payload)
	}
	// Unordered output:
	// dispatched: 3
	// orders: order 1 paid
	// orders: order 1 shipped
	// invoices: invoice 7 due
}
