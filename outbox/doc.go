// Package outbox is the library an application imports to use a transactional
// outbox in Postgres, and the sweeper that relays it to a broker.
//
// An application writes messages with a [Writer] inside the transaction that
// makes its business change, so a message exists if and only if the change
// committed:
//
//	w, _ := outbox.NewWriter(outbox.Table{})
//	tx, _ := pool.Begin(ctx)
//	// … the business change on tx …
//	err := w.Write(ctx, tx, outbox.Message{Topic: "orders.paid", Payload: body})
//	// … tx.Commit(ctx)
//
// A [Sweeper] reads outstanding rows in id order and sends them through a
// producer (see package producer), batch by batch:
//
//	page, in one tx: claim (FOR UPDATE SKIP LOCKED) ──▶ group by topic ──▶
//	    producer cuts batches ──▶ send each ──▶ raise attempts of failed rows
//	    ──▶ at the page's end, move the sent rows to <table>_history, commit
//
// Delivery is at least once: a row moves from the outbox to its history only
// after the broker accepted it, in the transaction that holds its lock. A crash, a lost database
// connection or a shutdown timeout between the broker's answer and the commit
// leaves the row outstanding, and it is sent again; brokers that de-duplicate by
// message id drop that copy.
//
// [Migrate] creates and upgrades the tables.
package outbox
