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
// A [Sweeper] relays outstanding rows to a producer (see package producer)
// in stages, each with one owner. A row's path is sweep → page → topic
// sender → page:
//
//	sweep (sweep.go): lists the topics with outstanding rows, and asks
//	  │   the gate (gate.go) which may send now: the broker breaker, the
//	  │   topic breaker's plan and trials, the backoff, the topics halted
//	  ▼   in this sweep. One answer, with a reason and until when.
//	page (page.go): BEGIN and claim_page.sql in one round trip: a share of
//	  │   each topic's rows, in id order, locked FOR UPDATE SKIP LOCKED.
//	  │   Nothing is written. During a drain the next page is claimed in
//	  │   the same transaction while this one sends, and the topics are
//	  │   split into two lanes, each paging its own in a transaction of its
//	  ▼   own, at once (sweep.go, pageLanes).
//	topic sender (send.go): one per topic, up to Concurrency at once; the
//	  │   producer cuts batches, sent in order:
//	  │     accepted ──▶ noted in the page
//	  │     failed ────▶ decide (policy.go) ──▶ execute (execute.go): the
//	  │                  breakers, and what the page records (attempts,
//	  ▼                  last_error, dead letters)
//	page end (page.go): move_dispatched.sql and COMMIT in one round trip: the sent
//	      rows move to <table>_history, dispatched_at set there; every
//	      lock is released, and rows not sent stay outstanding.
//
// Each stage's outcome (outcome.go) is reported once (report.go: the
// observer, the activity counters, the log) and added up to the sweep's
// [SweepResult]. Sending records only in its page: it never reaches the
// store.
//
// Delivery is at least once: a row moves from the outbox to its history only
// after the broker accepted it, in the transaction that holds its lock. A
// crash, a lost database connection or a shutdown timeout between the
// broker's answer and the commit leaves the row outstanding, and it is sent
// again; brokers that de-duplicate by message id drop that copy.
//
// [Migrate] creates and upgrades the tables.
package outbox
