package writer_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// exampleOutbox returns a pool and an outbox migrated into a schema of its
// own (`sweeper migrate` or outbox.Migrate make one), with an orders table
// beside it for the business change.
func exampleOutbox() (*pgxpool.Pool, writer.Table) {
	pool, tbl := dbtest.ExampleOutbox()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+tbl.Schema+".orders (id bigint PRIMARY KEY, status text)"); err != nil {
		panic(err)
	}
	return pool, tbl
}

// count prints how many messages of topic the outbox holds.
func count(pool *pgxpool.Pool, tbl writer.Table, topic string) {
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+tbl.Ident()+" WHERE topic = $1", topic).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Printf("%s: %d in the outbox\n", topic, n)
}

// The message commits with the business change, or not at all.
func ExampleWriter_Write() {
	ctx := context.Background()
	pool, tbl := exampleOutbox()
	w, err := writer.New(tbl) // keep one per table
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+tbl.Schema+".orders VALUES (42, 'paid')"); err != nil {
			return err
		}
		return w.Write(ctx, tx, writer.Message{
			Topic:         "orders.paid",
			Payload:       []byte(`{"order":42}`),
			ContentType:   "application/json",
			CorrelationID: "req-7",
			PartitionKey:  "42",
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	count(pool, tbl, "orders.paid")
	// Output: orders.paid: 1 in the outbox
}

// database/sql (and sqlx, GORM, Bun, ent over it) writes through WriteSQL, in
// the *sql.Tx of the business change. Any Postgres driver serves.
func ExampleWriter_WriteSQL() {
	ctx := context.Background()
	pool, tbl := exampleOutbox()
	var db *sql.DB = stdlib.OpenDBFromPool(pool) // or sql.Open("pgx" or "postgres", url)
	defer db.Close()
	w, err := writer.New(tbl)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+tbl.Schema+".orders VALUES (43, 'paid')"); err != nil {
		log.Fatal(err)
	}
	err = w.WriteSQL(ctx, tx,
		writer.Message{Topic: "orders.paid", Payload: []byte(`{"order":43}`)},
		writer.Message{Topic: "invoices.due", Payload: []byte(`{"order":43}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	count(pool, tbl, "orders.paid")
	count(pool, tbl, "invoices.due")
	// Output:
	// orders.paid: 1 in the outbox
	// invoices.due: 1 in the outbox
}

// Transactions that write one topic concurrently and need its messages
// delivered in commit order take the topic's lock with WriteOrdered: a second
// such transaction waits until the first ends, so id order is commit order.
func ExampleWriter_WriteOrdered() {
	ctx := context.Background()
	pool, tbl := exampleOutbox()
	w, err := writer.New(tbl)
	if err != nil {
		log.Fatal(err)
	}
	for _, status := range []string{"paid", "shipped"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := w.WriteOrdered(ctx, tx, writer.Message{Topic: "orders", Payload: []byte(status), PartitionKey: "42"}); err != nil {
				return err
			}
			// Keep the transaction short from here: writers of "orders" wait.
			_, err := tx.Exec(ctx, "INSERT INTO "+tbl.Schema+".orders VALUES (44, $1) ON CONFLICT (id) DO UPDATE SET status = $1", status)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	count(pool, tbl, "orders")
	// Output: orders: 2 in the outbox
}
