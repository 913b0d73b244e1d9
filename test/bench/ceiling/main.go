// Command ceiling measures what the database and each broker can do alone, on
// this machine, so that the sweeper's drain rate can be read as a share of it
// (`make bench` runs it beside the sweeper binary and prints the ratios).
//
//	ceiling db --database-url URL --table schema.outbox
//	ceiling rabbitmq --url URL --exchange NAME --topics a,b,c --messages 100000
//	ceiling nats --url URL --topics a,b,c --messages 100000
//	ceiling stdout --topics a,b,c --messages 100000 > /dev/null
//
// Each is the plainest fast program its client library allows, doing the work
// a relay cannot avoid and nothing more:
//
//   - db claims the outbox's outstanding rows in id order, 1,000 a statement on
//     one connection in autocommit, each from where the last ended, marks them dispatched and reads back every
//     column a relay sends (decoded, as a relay must), until none are left. No
//     page is read twice, no transaction is held open across a send, no topic
//     order is kept: a relay does more than this, never less.
//   - rabbitmq publishes persistent, mandatory messages with a message id to a
//     topic exchange, on 4 channels in confirm mode with up to 50 unconfirmed
//     each, and waits for every confirm (the sweeper's guarantee).
//   - nats publishes with JetStream's async API and a message id (duplicate
//     detection), up to 4,000 unacknowledged, and waits for every ack.
//   - stdout writes one JSON line per message to standard output.
//
// The payloads are as large as the benchmark's rows (--size, 512 bytes). It
// prints one JSON line: {"ceiling":…,"messages":…,"seconds":…}; the rate is
// messages/seconds. Setting up the exchange, queues and stream is the
// caller's: the same ones the sweeper is measured against.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ceiling db|rabbitmq|nats|stdout [flags]")
		os.Exit(2)
	}
	name := os.Args[1]
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	databaseURL := fs.String("database-url", "", "db: the database")
	table := fs.String("table", "", "db: the outbox table, schema-qualified")
	url := fs.String("url", "", "rabbitmq, nats: the broker")
	exchange := fs.String("exchange", "", "rabbitmq: the exchange")
	topics := fs.String("topics", "", "rabbitmq, nats, stdout: comma-separated topics, used in turn")
	messages := fs.Int("messages", 100_000, "rabbitmq, nats, stdout: how many messages")
	size := fs.Int("size", 512, "rabbitmq, nats, stdout: payload bytes")
	_ = fs.Parse(os.Args[2:])

	ctx := context.Background()
	payload := make([]byte, *size)
	for i := range payload {
		payload[i] = 'x'
	}
	list := strings.Split(*topics, ",")
	start := time.Now()
	var n int
	var err error
	switch name {
	case "db":
		n, err = db(ctx, *databaseURL, *table)
	case "rabbitmq":
		n, err = rabbitmq(*url, *exchange, list, *messages, payload)
	case "nats":
		n, err = nats(ctx, *url, list, *messages, payload)
	case "stdout":
		n, err = stdout(list, *messages, payload)
	default:
		err = fmt.Errorf("unknown ceiling %q: db, rabbitmq, nats or stdout", name)
	}
	elapsed := time.Since(start)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ceiling %s: %v\n", name, err)
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]any{"ceiling": name, "messages": n, "seconds": elapsed.Seconds()})
	fmt.Fprintln(os.Stderr, string(out)) // stderr: stdout may carry the messages
}

// db claims, marks and reads back every outstanding row. Its time includes
// connecting, as the sweeper's does.
func db(ctx context.Context, url, table string) (int, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	t := pgx.Identifier(strings.Split(table, ".")).Sanitize()
	// From where the previous statement ended (id > $1): from the start, each
	// statement would step over the index entries of every row marked before,
	// dead but not yet vacuumed.
	claim := `UPDATE ` + t + ` SET dispatched_at = now()
		WHERE id IN (SELECT id FROM ` + t + ` WHERE dispatched_at IS NULL AND id > $1 ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
		RETURNING id, message_id::text, topic, payload, headers, content_type, correlation_id, partition_key, created_at, attempts`
	var (
		id, attempts                             int64
		messageID, topic                         string
		payload, headers                         []byte
		contentType, correlationID, partitionKey *string
		createdAt                                time.Time
	)
	total := 0
	var last int64
	for {
		rows, err := conn.Query(ctx, claim, last)
		if err != nil {
			return total, err
		}
		n := 0
		if _, err := pgx.ForEachRow(rows, []any{&id, &messageID, &topic, &payload, &headers, &contentType, &correlationID, &partitionKey, &createdAt, &attempts}, func() error {
			n++
			last = max(last, id)
			return nil
		}); err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil
		}
		total += n
	}
}

func rabbitmq(url, exchange string, topics []string, n int, payload []byte) (int, error) {
	const channels, inFlight = 4, 50
	conn, err := amqp.Dial(url)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var wg sync.WaitGroup
	errs := make(chan error, channels)
	for c := range channels {
		wg.Go(func() {
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				errs <- err
				return
			}
			returns := ch.NotifyReturn(make(chan amqp.Return, 1))
			pending := make([]*amqp.DeferredConfirmation, 0, inFlight)
			wait := func() error {
				for _, dc := range pending {
					if !dc.Wait() {
						return fmt.Errorf("message %d nacked", dc.DeliveryTag)
					}
				}
				pending = pending[:0]
				select {
				case r := <-returns:
					return fmt.Errorf("message returned: %s", r.ReplyText)
				default:
					return nil
				}
			}
			for i := c; i < n; i += channels {
				dc, err := ch.PublishWithDeferredConfirm(exchange, topics[i%len(topics)], true, false, amqp.Publishing{
					DeliveryMode: amqp.Persistent, MessageId: rand.Text(), Body: payload,
				})
				if err != nil {
					errs <- err
					return
				}
				if pending = append(pending, dc); len(pending) == inFlight {
					if err := wait(); err != nil {
						errs <- err
						return
					}
				}
			}
			if err := wait(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return n, <-errs
}

func nats(ctx context.Context, url string, topics []string, n int, payload []byte) (int, error) {
	nc, err := natsgo.Connect(url)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4000))
	if err != nil {
		return 0, err
	}
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		// With 4,000 acks outstanding a publish waits for room; the
		// client's default gives up after 200ms, which a busy server's
		// acks can take: wait as long as the run may.
		f, err := js.PublishMsgAsync(&natsgo.Msg{Subject: topics[i%len(topics)], Data: payload},
			jetstream.WithMsgID(rand.Text()), jetstream.WithStallWait(time.Minute))
		if err != nil {
			return 0, err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return n, nil
}

func stdout(topics []string, n int, payload []byte) (int, error) {
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	body := string(payload)
	for i := range n {
		line, err := json.Marshal(map[string]any{"id": i + 1, "topic": topics[i%len(topics)], "payload": body})
		if err != nil {
			return 0, err
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return 0, err
		}
	}
	return n, w.Flush()
}
